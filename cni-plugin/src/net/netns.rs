//! The one place that switches network namespaces. The plugin is single-threaded (a
//! current-thread tokio runtime), so switching the calling thread is enough; it always switches
//! back before returning.
use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    path::Path,
};

use nix::sched::{CloneFlags, setns};

pub struct Netns {
    file: File,
}

impl Netns {
    /// Opens a namespace file (`/run/netns/x`, `/proc/<pid>/ns/net`); anything not on nsfs is
    /// refused with `InvalidInput`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        let on_nsfs = nix::sys::statfs::fstatfs(&file).is_ok_and(|s| s.filesystem_type().0 == libc::NSFS_MAGIC);
        if !on_nsfs {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a namespace file"));
        }
        Ok(Self { file })
    }

    /// The namespace the calling thread is in now.
    pub fn current() -> io::Result<Self> {
        Self::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// Whether both files name one namespace (same nsfs inode).
    pub fn is(&self, other: &Self) -> io::Result<bool> {
        let (a, b) = (nix::sys::stat::fstat(&self.file)?, nix::sys::stat::fstat(&other.file)?);
        Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` inside this namespace (sockets opened there stay bound to it) and switches back.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> io::Result<T> {
        let home = Self::current()?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)?;
        let out = f();
        // Failing to return would leave every later step acting on the pod: stop right here.
        setns(home.file.as_fd(), CloneFlags::CLONE_NEWNET).expect("cannot return to the node's network namespace");
        Ok(out)
    }
}
