//! RAII guards for what a run creates outside its own process.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Runs a command and fails with its stderr when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<Output> {
    let out = Command::new(program).args(args).output().with_context(|| format!("spawning {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

/// Runs a command inside a network namespace (nsenter only switches the network namespace, so
/// the private bpffs mount stays visible, unlike `ip netns exec`).
pub fn run_in(netns: &str, program: &str, args: &[&str]) -> Result<Output> {
    let net = format!("--net=/run/netns/{netns}");
    let mut full = vec![net.as_str(), program];
    full.extend_from_slice(args);
    run("nsenter", &full)
}

/// A named network namespace, deleted on drop.
pub struct NetnsGuard {
    pub name: String,
}

impl NetnsGuard {
    pub fn create(name: &str) -> Result<Self> {
        run("ip", &["netns", "add", name])?;
        let guard = Self { name: name.to_string() };
        run_in(name, "ip", &["link", "set", "lo", "up"])?;
        Ok(guard)
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        // Deleting the namespace destroys every interface in it (and so both ends of its veths).
        // Quietly: a test may have deleted it already (a sandbox that vanished).
        let _ = Command::new("ip").args(["netns", "del", &self.name]).stderr(std::process::Stdio::null()).status();
    }
}

/// A private bpffs mount (and the directory holding it and the data dir), removed on drop.
pub struct Bpffs {
    pub base: PathBuf,
}

impl Bpffs {
    pub fn mount(base: &Path) -> Result<Self> {
        let mount_point = base.join("bpffs");
        std::fs::create_dir_all(&mount_point)?;
        let guard = Self { base: base.to_path_buf() };
        run("mount", &["-t", "bpf", "bpf", mount_point.to_str().context("utf-8 path")?])?;
        Ok(guard)
    }

    pub fn mount_point(&self) -> PathBuf {
        self.base.join("bpffs")
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        // Unmounting drops every pin in it; links and programs go with their last reference.
        let _ = Command::new("umount").arg(self.mount_point()).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A mount namespace of its own, held open by a sleeping child (killed by its PID on drop).
/// Mounts of the node's namespace still reach it (`slave`: pods' netns files created later
/// stay usable), but nothing mounted in it reaches the node: a test can play a fresh node
/// without bpffs and let the plugin mount one.
pub struct MountNamespace {
    holder: Child,
}

impl MountNamespace {
    pub fn create() -> Result<Self> {
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "slave", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .context("spawning unshare")?;
        let ns = Self { holder };
        let ours = std::fs::read_link("/proc/self/ns/mnt")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(ns.path()).ok().is_none_or(|theirs| theirs == ours) {
            if Instant::now() > deadline {
                bail!("unshare did not enter a new mount namespace");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(ns)
    }

    /// `/proc/<holder>/ns/mnt`, to enter it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.holder.id()))
    }

    /// `path` as seen from inside the namespace.
    pub fn inside(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(path.strip_prefix("/").unwrap_or(path))
    }
}

impl Drop for MountNamespace {
    fn drop(&mut self) {
        // The namespace, and every mount made in it, goes with its last process.
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
