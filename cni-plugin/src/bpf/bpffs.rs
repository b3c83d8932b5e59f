//! bpffs, where the pins live. A fresh node may boot without it on `/sys/fs/bpf` (nothing in a
//! minimal distribution mounts it); like Cilium's agent, the plugin then mounts it itself on
//! the parent of its root (`/sys/fs/bpf` for the default root) rather than leave the node
//! NotReady until someone does it by hand. The mount is made in the runtime's mount
//! namespace, the node's, so it outlives this process.
use std::{fs::File, io, os::unix::fs::MetadataExt as _, path::Path};

use nix::{
    fcntl::{Flock, FlockArg},
    mount::{MsFlags, mount},
};

/// Makes sure `root` is on bpffs, or can be created on it; mounts bpffs on its parent when
/// neither is. Returns the mount point when it mounted one.
pub fn ensure_mounted(root: &Path) -> io::Result<Option<&Path>> {
    if on_bpffs_or_below(root) {
        return Ok(None);
    }
    let at = mount_point(root);
    refuse_to_hide_anything(at)?;
    // Two first ADDs on a fresh node must not stack two bpffs instances (the later would hide
    // the pins made on the earlier): the directory is locked while checked and mounted. A
    // process that opens it after the mount gets the new bpffs root, sees bpffs and skips.
    let dir = File::open(at).map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", at.display())))?;
    let _lock = Flock::lock(dir, FlockArg::LockExclusive).map_err(|(_, errno)| io::Error::from(errno))?;
    if on_bpffs(at) {
        return Ok(None);
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("bpf"), at, Some("bpf"), flags, Some("mode=0700")).map_err(|errno| {
        io::Error::new(io::Error::from(errno).kind(), format!("mount -t bpf bpf {}: {errno}", at.display()))
    })?;
    Ok(Some(at))
}

/// Only an empty directory that is not a mount point already gets bpffs (as `/sys/fs/bpf` on a
/// fresh node): a root such as `/sys/fs/bpf` itself or `/run/x` must never hide `/sys/fs` or
/// `/run` under a new mount; those get the error instead.
fn refuse_to_hide_anything(at: &Path) -> io::Result<()> {
    let refuse = |why: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {why}", at.display())));
    let meta = match std::fs::metadata(at) {
        Ok(meta) if meta.is_dir() => meta,
        Ok(_) => return refuse("not a directory"),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", at.display()))),
    };
    if std::fs::read_dir(at)?.next().is_some() {
        return refuse("not empty, and a mount would hide what it holds");
    }
    let parent = at.parent().unwrap_or(at);
    let on_its_own = std::fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) || parent == at;
    if on_its_own {
        return refuse("already a mount point of another filesystem");
    }
    Ok(())
}

/// Where bpffs goes for `root`: its parent, or the root itself when it has none.
pub fn mount_point(root: &Path) -> &Path {
    root.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(root)
}

/// The root is on bpffs, or will be once created (its parent is).
pub fn on_bpffs_or_below(root: &Path) -> bool {
    let probe = if root.exists() { root } else { mount_point(root) };
    on_bpffs(probe)
}

fn on_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type().0 == libc::BPF_FS_MAGIC)
}
