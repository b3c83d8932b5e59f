//! A cgroup of the test's own under the machine's cgroup2 mount, for the socket LB's programs
//! (never the root cgroup, which every process of the machine shares). Processes are started
//! in it; on drop any still there are moved to the parent and the cgroup is removed, pass or fail.
use std::{
    ffi::CString,
    os::unix::{ffi::OsStrExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

/// Where this machine mounts cgroup2.
pub const CGROUP2_MOUNT: &str = "/sys/fs/cgroup/unified";

pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// `<mount>/<name>`; `name` must be unique to the run.
    pub fn create(name: &str) -> Result<Self> {
        let path = Path::new(CGROUP2_MOUNT).join(name);
        std::fs::create_dir(&path).with_context(|| format!("creating cgroup {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `command` join this cgroup before it runs (after fork, before exec), so every
    /// socket it creates belongs to the cgroup.
    pub fn confine(&self, command: &mut Command) -> Result<()> {
        let procs = CString::new(self.path.join("cgroup.procs").as_os_str().as_bytes())?;
        // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
            })
        };
        Ok(())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let parent = self.path.parent().unwrap_or(Path::new(CGROUP2_MOUNT)).join("cgroup.procs");
        if let Ok(pids) = std::fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write(&parent, pid);
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!("cannot remove cgroup {}: {e}", self.path.display());
        }
    }
}
