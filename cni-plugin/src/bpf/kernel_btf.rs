//! Loading without parsing the kernel's BTF when the object does not need it.
//!
//! aya 0.14's `EbpfLoader::new()` always reads and parses `/sys/kernel/btf/vmlinux` (about
//! 6 MB in some 1,400 reads, 30–50 ms here: most of a first ADD) so that it can apply CO-RE
//! relocations. Our object has none, so the loader is created with that file out of sight: in
//! a private copy of the mount namespace with an empty tmpfs over `/sys/kernel/btf`, left again
//! as soon as the loader exists. Mounts made in the copy are private and never reach the node.
use std::{fs::File, path::Path};

use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, setns, unshare},
};

const KERNEL_BTF_DIR: &str = "/sys/kernel/btf";

/// While alive, this process sees no kernel BTF; dropping it returns to the node's mount
/// namespace.
pub struct Hidden {
    original: File,
    /// The working directory, which entering a mount namespace resets to its root.
    cwd: Option<File>,
}

impl Hidden {
    /// Hides the kernel's BTF from this thread unless the object `needs` it for CO-RE
    /// relocations, or returns `None` (and the loader parses the BTF, slower but correct). The namespace
    /// belongs to the calling thread: the guard must be dropped on the thread that made it
    /// and never held across an `.await` (the plugin's runtime has one thread anyway).
    pub fn unless_needed(needed: bool) -> Option<Self> {
        if needed || !Path::new(KERNEL_BTF_DIR).exists() {
            return None;
        }
        let original = File::open("/proc/thread-self/ns/mnt").ok()?;
        let cwd = File::open(".").ok();
        if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
            log::debug!("parsing kernel BTF after all: cannot unshare the mount namespace: {e}");
            return None;
        }
        // From here on, dropping `hidden` goes back to the node's namespace.
        let hidden = Self { original, cwd };
        let private = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>);
        let covered = private
            .and_then(|()| mount(Some("none"), KERNEL_BTF_DIR, Some("tmpfs"), MsFlags::MS_RDONLY, Some("size=4k")));
        if let Err(e) = covered {
            log::debug!("parsing kernel BTF after all: cannot cover {KERNEL_BTF_DIR}: {e}");
            return None;
        }
        Some(hidden)
    }
}

impl Drop for Hidden {
    fn drop(&mut self) {
        // Failing here leaves this thread in its private copy, which holds the same bpffs and
        // files as the node's but not mounts made later: harmless for the plugin, which exits
        // soon; the agent's thread stays there, so it is an error.
        if let Err(e) = setns(&self.original, CloneFlags::CLONE_NEWNS) {
            log::error!("cannot return to the node's mount namespace: {e}");
        }
        if let Some(cwd) = &self.cwd {
            let _ = nix::unistd::fchdir(cwd);
        }
    }
}
