//! Spare files: the inodes of released reservations and records, kept in `.aside/` for the
//! next files written aside. This filesystem-level detail keeps ADD flat: ext4 without a
//! journal gives a new file the group's first free inode that was not freed in the last
//! minutes (`find_inode_bit`, `recently_deleted`: up to six when the inode table is being
//! written), reading the inode table for every one it passes over. On a node whose pods come
//! and go each creation then stepped over every file the recent DELs had removed. A DEL
//! renames its files here instead of removing them and an ADD renames one back, so that churn
//! frees and allocates no inode.
//!
//! At most [`KEPT`] spares: each goes to a slot picked by its name (a second one in a slot
//! replaces the first). They name no address and hold no holder, so readers of host-local's
//! layout pass over them, and the leftover cleanup (`.name.tmp` only) leaves them. A DEL that
//! leaves the network without pins (its last attachment) and every GC remove them
//! (`drop_spares`), so that a node without pods keeps nothing.
use std::{
    fs::{self, File, OpenOptions},
    hash::{Hash as _, Hasher as _},
    io::{self, ErrorKind},
    path::Path,
};

use super::store::{ASIDE, Store};

/// The slots: enough for the files of the attachments deleted between two ADDs under churn.
const KEPT: u64 = 32;
/// Starts a spare's name.
const PREFIX: &str = "spare.";

impl Store {
    /// Opens `path` (in `.aside/`) for writing from its start: a spare renamed there when there
    /// is one, else a new file.
    pub(super) fn create_aside(&self, path: &Path) -> io::Result<File> {
        if let Ok(entries) = fs::read_dir(self.dir.join(ASIDE)) {
            for entry in entries.filter_map(Result::ok) {
                if !entry.file_name().to_str().is_some_and(is_spare) {
                    continue;
                }
                if fs::rename(entry.path(), path).is_ok() {
                    return OpenOptions::new().write(true).truncate(true).open(path);
                }
            }
        }
        File::create(path)
    }

    /// Removes the file at `path` (a reservation or a record of this network), keeping its
    /// inode as a spare; a missing file is `NotFound`, as `fs::remove_file` says.
    pub(super) fn retire(&self, path: &Path) -> io::Result<()> {
        let mut slot = std::collections::hash_map::DefaultHasher::new();
        path.file_name().hash(&mut slot);
        let spare = self.dir.join(ASIDE).join(format!("{PREFIX}{}", slot.finish() % KEPT));
        match fs::rename(path, &spare) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(e),
            Err(_) => fs::remove_file(path),
        }
    }

    /// Removes every spare (the network's last attachment is gone).
    pub fn drop_spares(&self) -> io::Result<()> {
        for entry in fs::read_dir(self.dir.join(ASIDE))?.filter_map(Result::ok) {
            if entry.file_name().to_str().is_some_and(is_spare) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}

fn is_spare(name: &str) -> bool {
    name.strip_prefix(PREFIX).is_some_and(|slot| slot.parse::<u64>().is_ok())
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt as _};

    use super::*;

    #[test]
    fn a_retired_file_lends_its_inode_to_the_next_write_and_the_last_del_drops_the_rest() {
        let dir = std::env::temp_dir().join(format!("ebpf-cni-spares-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let store = Store::lock(&dir, "net").unwrap();
        let net = dir.join("net");
        fs::write(net.join("10.9.0.2"), b"a\r\neth0").unwrap();
        let inode = fs::metadata(net.join("10.9.0.2")).unwrap().ino();
        store.retire(&net.join("10.9.0.2")).unwrap();
        assert!(!net.join("10.9.0.2").exists());
        assert_eq!(store.retire(&net.join("10.9.0.2")).unwrap_err().kind(), ErrorKind::NotFound);
        let aside = net.join(ASIDE).join(".10.9.0.3.1.tmp");
        let mut file = store.create_aside(&aside).unwrap();
        std::io::Write::write_all(&mut file, b"b").unwrap();
        assert_eq!(fs::metadata(&aside).unwrap().ino(), inode, "the spare's inode, not a new one");
        assert_eq!(fs::read(&aside).unwrap(), b"b", "truncated, then written");
        fs::remove_file(&aside).unwrap();
        // Slots bound the spares; the last DEL removes them and leaves anything else.
        for n in 0..100 {
            let path = net.join(format!("10.9.1.{n}"));
            fs::write(&path, b"x").unwrap();
            store.retire(&path).unwrap();
        }
        let spares = || fs::read_dir(net.join(ASIDE)).unwrap().count();
        assert!(spares() <= KEPT as usize);
        fs::write(net.join(ASIDE).join(".10.9.0.4.1.tmp"), b"").unwrap();
        store.drop_spares().unwrap();
        assert_eq!(spares(), 1);
        drop(store);
        fs::remove_dir_all(dir).unwrap();
    }
}
