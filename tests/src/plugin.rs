//! Executes `ebpf-cni` the way a container runtime does.
use std::{
    fs::File,
    io::Write,
    os::{
        fd::AsFd as _,
        unix::process::{CommandExt as _, ExitStatusExt as _},
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::Value;

/// One invocation's outcome.
#[derive(Debug)]
pub struct CniOutput {
    pub success: bool,
    /// The signal that ended the process, if one did (SIGKILL in crash tests).
    pub killed_by: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The process's peak resident set size (`ru_maxrss` from wait4), KiB.
    pub peak_rss_kib: u64,
}

impl CniOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or(Value::Null)
    }

    /// The error code of a failed call (`None` if it succeeded or printed no error JSON).
    pub fn code(&self) -> Option<u64> {
        if self.success { None } else { self.json().get("code")?.as_u64() }
    }
}

#[derive(Clone, Debug)]
pub struct Plugin {
    pub binary: PathBuf,
}

impl Plugin {
    /// The binary under test: `EBPF_CNI_BIN`, else the workspace's debug build.
    pub fn from_env() -> Result<Self> {
        let binary = std::env::var_os("EBPF_CNI_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ebpf-cni"));
        anyhow::ensure!(binary.is_file(), "plugin binary {} not found: run `cargo xtask build`", binary.display());
        Ok(Self { binary })
    }

    /// Runs the plugin in `node_netns` with exactly the given CNI_* variables and stdin.
    pub fn exec(&self, node_netns: &str, env: &[(&str, &str)], stdin: &str) -> Result<CniOutput> {
        exec_binary(&self.binary, node_netns, env, stdin)
    }

    /// Like [`Self::exec`], the process sent SIGKILL `after` it started (if still running):
    /// a crash at whatever step it had reached, in any build.
    pub fn exec_killed_after(
        &self,
        node_netns: &str,
        env: &[(&str, &str)],
        stdin: &str,
        after: Duration,
    ) -> Result<CniOutput> {
        exec_binary_in(&self.binary, node_netns, None, env, stdin, Some(after))
    }

    /// Whether the binary stops at named crash points (`EBPF_CNI_DIE_AT`): debug builds only.
    pub fn has_crash_points(&self) -> Result<bool> {
        let bytes = std::fs::read(&self.binary).with_context(|| format!("reading {}", self.binary.display()))?;
        Ok(bytes.windows(CRASH_VARIABLE.len()).any(|w| w == CRASH_VARIABLE))
    }

    /// Like [`Self::exec`], also in the mount namespace `mount_ns` (a `/proc/<pid>/ns/mnt`).
    pub fn exec_in(&self, node_netns: &str, mount_ns: &Path, env: &[(&str, &str)], stdin: &str) -> Result<CniOutput> {
        exec_binary_in(&self.binary, node_netns, Some(mount_ns), env, stdin, None)
    }

    /// The directory holding the binary: the first entry of CNI_PATH when chaining.
    pub fn dir(&self) -> PathBuf {
        self.binary.parent().map(PathBuf::from).unwrap_or_default()
    }
}

/// Runs any CNI plugin binary in `node_netns` with exactly the given variables and stdin. The
/// child enters the namespace itself between fork and exec (no `nsenter` in between), so the
/// elapsed time is the plugin's, as a runtime that execs it directly sees it.
pub fn exec_binary(binary: &Path, node_netns: &str, env: &[(&str, &str)], stdin: &str) -> Result<CniOutput> {
    exec_binary_in(binary, node_netns, None, env, stdin, None)
}

/// The variable a debug build reads for its crash point (see `cni-plugin/src/fault.rs`).
const CRASH_VARIABLE: &[u8] = b"EBPF_CNI_DIE_AT";

fn exec_binary_in(
    binary: &Path,
    node_netns: &str,
    mount_ns: Option<&Path>,
    env: &[(&str, &str)],
    stdin: &str,
    kill_after: Option<Duration>,
) -> Result<CniOutput> {
    let ns_path = format!("/run/netns/{node_netns}");
    let ns = File::open(&ns_path).with_context(|| format!("opening {ns_path}"))?;
    let mnt = mount_ns.map(|p| File::open(p).with_context(|| format!("opening {}", p.display()))).transpose()?;
    let mut command = Command::new(binary);
    // SAFETY: setns is a single syscall on descriptors the parent keeps open until spawn returns.
    unsafe {
        command.pre_exec(move || {
            use nix::sched::{CloneFlags, setns};
            if let Some(mnt) = &mnt {
                setns(mnt.as_fd(), CloneFlags::CLONE_NEWNS).map_err(std::io::Error::from)?;
            }
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
        });
    }
    let started = Instant::now();
    let mut child = command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", binary.display()))?;
    if let Some(after) = kill_after {
        kill_later(child.id(), after)?;
    }
    // A plugin killed before it read its configuration closed the pipe: its status tells.
    match child.stdin.take().context("stdin")?.write_all(stdin.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    let mut stderr_pipe = child.stderr.take().context("stderr")?;
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr_pipe, &mut text);
        text
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().context("stdout")?, &mut stdout)?;
    let stderr = stderr_reader.join().map_err(|_| anyhow::anyhow!("stderr reader panicked"))?;
    let (status, peak_rss_kib) = wait_with_rusage(child.id())?;
    Ok(CniOutput {
        success: status.success(),
        killed_by: status.signal(),
        stdout,
        stderr,
        elapsed: started.elapsed(),
        peak_rss_kib,
    })
}

/// Sends SIGKILL to `pid` in `after`, through a pidfd: once the child has exited and been
/// reaped the signal goes nowhere, never to a process that reused the PID.
fn kill_later(pid: u32, after: Duration) -> Result<()> {
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    anyhow::ensure!(raw >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptor was just opened and is owned by nothing else.
    let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as i32) };
    std::thread::spawn(move || {
        std::thread::sleep(after);
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                std::os::fd::AsRawFd::as_raw_fd(&pidfd),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    });
    Ok(())
}

/// Reaps the child with wait4, which also reports its peak RSS (std's wait does not).
fn wait_with_rusage(pid: u32) -> Result<(std::process::ExitStatus, u64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data that the kernel fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our child, not yet reaped; both pointers are valid for the call.
        let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if reaped >= 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("wait4");
        }
    }
    Ok((std::process::ExitStatus::from_raw(status), usage.ru_maxrss.max(0) as u64))
}
