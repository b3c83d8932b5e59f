//! Loading without parsing the kernel's BTF when the object does not need it.
//!
//! aya 0.14's `EbpfLoader::new()` always reads and parses `/sys/kernel/btf/vmlinux` (about
//! 6 MB in some 1,400 reads, 30–50 ms here: most of a first ADD) so that it can apply CO-RE
//! relocations. Our object has none, so the loader is created with that file out of sight: the
//! creating thread is given a filesystem context of its own (root and working directory) and
//! its root is moved to `/sys/kernel/btf` itself, where no `sys/kernel/btf/vmlinux` is found,
//! then put back as soon as the loader exists. Not a private mount namespace with a tmpfs over
//! the directory: leaving it tears the namespace down, and unmounting waits for an RCU grace
//! period (8–25 ms here).
use std::{fs::File, path::Path};

use nix::{
    sched::{CloneFlags, unshare},
    unistd::{chroot, fchdir},
};

const KERNEL_BTF_DIR: &str = "/sys/kernel/btf";

/// While alive, this thread sees no kernel BTF; dropping it gives the thread back its root and
/// working directory.
pub struct Hidden {
    root: File,
    cwd: File,
}

impl Hidden {
    /// Hides the kernel's BTF from this thread unless the object `needs` it for CO-RE
    /// relocations, or returns `None` (and the loader parses the BTF, slower but correct). The
    /// guard must be dropped on the thread that made it and never held across an `.await`
    /// (the plugin's runtime has one thread anyway); other threads keep their root throughout.
    pub fn unless_needed(needed: bool) -> Option<Self> {
        if needed || !Path::new(KERNEL_BTF_DIR).exists() {
            return None;
        }
        let (root, cwd) = (File::open("/").ok()?, File::open(".").ok()?);
        // Threads share root and working directory unless one unshares them (cheap, nothing
        // for the kernel to wait for); a single-threaded plugin has them to itself already.
        if let Err(e) = unshare(CloneFlags::CLONE_FS) {
            log::debug!("parsing kernel BTF after all: cannot unshare the filesystem context: {e}");
            return None;
        }
        if let Err(e) = chroot(KERNEL_BTF_DIR) {
            log::debug!("parsing kernel BTF after all: cannot change root to {KERNEL_BTF_DIR}: {e}");
            return None;
        }
        Some(Self { root, cwd })
    }
}

impl Drop for Hidden {
    fn drop(&mut self) {
        // Back to the saved root (a directory outside the current root stays reachable through
        // its descriptor), then to the saved working directory. Failing leaves this thread's
        // root at the BTF directory: for the agent's thread that is an error.
        let restored = fchdir(&self.root).and_then(|()| chroot(".")).and_then(|()| fchdir(&self.cwd));
        if let Err(e) = restored {
            log::error!("cannot give the thread its root directory back: {e}");
        }
    }
}
