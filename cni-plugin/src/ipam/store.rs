//! host-local's on-disk layout, so an existing host-local data dir keeps working:
//! `<dataDir>/<network>/<ip>` (the address's canonical text, `10.244.1.2` or `fd00::2`) holds `<containerID>\r\n<ifname>`, `last_reserved_ip.<set>` the
//! last address handed out from range set `<set>`, and `lock` is flocked around every change.
//! Our reservations and records are whole or absent (written aside in `.aside/`, then linked
//! or renamed into place); `last_reserved_ip.<set>` is overwritten in place (a torn one only
//! restarts round-robin). Torn files left by anyone else are detected and repaired under the
//! lock. Beside them, `attachments/` records which addresses each attachment holds
//! (`record.rs`), and `.aside/` keeps the inodes of released files for the next ones
//! (`spares.rs`).
use std::{
    fs::{self, File, OpenOptions},
    io::{ErrorKind, Write},
    net::IpAddr,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};

use crate::cni::{CniResult, Context, ErrorCode};

/// host-local separates ID and interface with CRLF; we write the same so both can read it.
pub(super) const LINE_BREAK: &str = "\r\n";
/// Ends the names of files written aside before they are linked or renamed into place.
const TEMP_SUFFIX: &str = ".tmp";
/// Where files are written aside: a directory of its own, empty but for a crashed writer's
/// leftovers, so that DEL finds those without listing every reservation. (Earlier builds wrote
/// aside beside the reservations; GC removes what they left there.)
pub(super) const ASIDE: &str = ".aside";

pub struct Store {
    pub(super) dir: PathBuf,
    _lock: Flock<File>,
}

impl Store {
    /// Opens (creating if needed) the network's directory and takes its lock until drop.
    pub fn lock(data_dir: &Path, network: &str) -> CniResult<Self> {
        let dir = data_dir.join(network);
        fs::create_dir_all(dir.join(ASIDE)).cni(ErrorCode::IO, format!("cannot create IPAM dir {}", dir.display()))?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .cni(ErrorCode::IO, "cannot open IPAM lock file")?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .cni(ErrorCode::IO, "cannot lock IPAM dir")?;
        Ok(Self { dir, _lock: lock })
    }

    /// Reserves `ip` for the attachment; `false` if it was already taken. The file appears whole
    /// or not at all (written aside, then hard-linked into place, which fails if the name
    /// exists), so a crash never leaves a half-written reservation of ours. One torn by someone
    /// else (host-local killed between create and write, a power loss before writeback) holds
    /// no owner that DEL or GC could ever match: it is replaced here.
    pub fn reserve(&self, ip: IpAddr, id: &str, ifname: &str, set: usize) -> CniResult<bool> {
        let path = self.dir.join(ip.to_string());
        let aside = self.write_aside(&ip.to_string(), &format!("{}{LINE_BREAK}{ifname}", id.trim()))?;
        crate::fault::point("ipam:mid-reserve");
        let mut linked = fs::hard_link(&aside, &path);
        if linked.as_ref().is_err_and(|e| e.kind() == ErrorKind::AlreadyExists) && self.remove_if_torn(ip) {
            linked = fs::hard_link(&aside, &path);
        }
        // Linked, the name aside goes and the inode stays the reservation's; not linked, it is
        // kept as a spare (`spares.rs`).
        let _ = if linked.is_ok() { fs::remove_file(&aside) } else { self.retire(&aside) };
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e).cni(ErrorCode::IO, format!("cannot reserve {ip}")),
        }
        self.record_last_reserved(set, ip)?;
        Ok(true)
    }

    /// Overwrites `last_reserved_ip.<set>` in place. Not written aside and renamed over: that
    /// frees an inode per ADD, and ext4 makes every later file creation step over the inodes
    /// freed in the last minutes (`recently_deleted`), so that ADD grew with the pods a node
    /// had just started. A crash between the write and the truncation leaves a torn record,
    /// which [`Self::last_reserved`] reports and ignores.
    fn record_last_reserved(&self, set: usize, ip: IpAddr) -> CniResult<()> {
        let text = ip.to_string();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(format!("last_reserved_ip.{set}")))
            .cni(ErrorCode::IO, "cannot record last reserved IP")?;
        file.write_all_at(text.as_bytes(), 0)
            .and_then(|()| file.set_len(text.len() as u64))
            .cni(ErrorCode::IO, "cannot record last reserved IP")
    }

    /// Writes `content` to a temporary name in `.aside/`. Leftovers of a crash are ignored by
    /// every reader (not an address) and removed by [`Self::remove_leftovers`].
    pub(super) fn write_aside(&self, name: &str, content: &str) -> CniResult<PathBuf> {
        let path = self.dir.join(ASIDE).join(format!(".{name}.{}{TEMP_SUFFIX}", std::process::id()));
        let mut file = self.create_aside(&path).cni(ErrorCode::IO, format!("cannot write {}", path.display()))?;
        file.write_all(content.as_bytes()).cni(ErrorCode::IO, format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    /// Removes the temporary files of writers that crashed; safe under the lock, which every
    /// writer holds. Returns how many. `.aside/` only (DEL): it is empty unless a writer
    /// crashed; with `beside_reservations` (GC) also those of earlier builds, which wrote them
    /// among the reservations.
    pub fn remove_leftovers(&self, beside_reservations: bool) -> CniResult<usize> {
        let mut removed = self.remove_leftovers_in(&self.dir.join(ASIDE))?;
        if beside_reservations {
            removed += self.remove_leftovers_in(&self.dir)?;
        }
        Ok(removed)
    }

    fn remove_leftovers_in(&self, dir: &Path) -> CniResult<usize> {
        let mut removed = 0;
        for entry in fs::read_dir(dir).cni(ErrorCode::IO, "cannot list IPAM dir")? {
            let entry = entry.cni(ErrorCode::IO, "cannot list IPAM dir")?;
            if entry.file_name().to_str().is_some_and(|n| n.starts_with('.') && n.ends_with(TEMP_SUFFIX)) {
                fs::remove_file(entry.path()).cni(ErrorCode::IO, "cannot remove a leftover temporary file")?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes the reservation of `ip` if it names no holder; `true` if it did.
    fn remove_if_torn(&self, ip: IpAddr) -> bool {
        if !self.holder(ip).is_some_and(|h| h.is_torn()) {
            return false;
        }
        log::warn!("reservation {ip} names no container (a torn write); reusing the address");
        self.remove(ip).is_ok()
    }

    /// Creates and removes a file, which fails on a read-only or full filesystem.
    pub fn probe_writable(&self) -> CniResult<()> {
        let probe = self.dir.join(format!(".status-{}", std::process::id()));
        fs::write(&probe, b"").cni(ErrorCode::IO, format!("cannot write in {}", self.dir.display()))?;
        fs::remove_file(&probe).cni(ErrorCode::IO, "cannot remove the probe file")
    }

    /// Where round-robin resumes. A record that does not parse (torn) is reported and ignored:
    /// allocation starts from the range's start, and the next reservation rewrites it whole.
    pub fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        let content = fs::read(self.dir.join(format!("last_reserved_ip.{set}"))).ok()?;
        let parsed = std::str::from_utf8(&content).ok().and_then(|s| s.trim().parse().ok());
        if parsed.is_none() {
            log::warn!("last_reserved_ip.{set} is torn ({content:?}); starting from the range start");
        }
        parsed
    }

    /// Taken: a reservation file with content. One stat, as allocation walks the range with it;
    /// an empty file (the usual torn write) does not count, and the next reserve replaces it.
    /// Other content naming no container is left to GC.
    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        fs::metadata(self.dir.join(ip.to_string())).is_ok_and(|m| m.len() > 0)
    }

    /// How many reservation files there are (any family, any set, torn or not): a bound on
    /// how many addresses a search for a free one can find taken. One listing, no reads.
    pub fn reservation_count(&self) -> CniResult<usize> {
        let entries = fs::read_dir(&self.dir).cni(ErrorCode::IO, "cannot list IPAM dir")?;
        Ok(entries.filter_map(Result::ok).filter(|e| parse_ip(&e.file_name()).is_some()).count())
    }

    /// Every reservation: the address and who holds it.
    pub fn reservations(&self) -> CniResult<Vec<(IpAddr, Holder)>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir).cni(ErrorCode::IO, "cannot list IPAM dir")? {
            let entry = entry.cni(ErrorCode::IO, "cannot list IPAM dir")?;
            let Some(ip) = parse_ip(&entry.file_name()) else { continue };
            let Ok(content) = fs::read(entry.path()) else { continue };
            found.push((ip, Holder::parse(&content)));
        }
        Ok(found)
    }

    /// The holder of one address, if it is reserved.
    pub fn holder(&self, ip: IpAddr) -> Option<Holder> {
        fs::read(self.dir.join(ip.to_string())).ok().map(|c| Holder::parse(&c))
    }

    /// Every address reserved for the attachment.
    pub fn find(&self, id: &str, ifname: &str) -> CniResult<Vec<IpAddr>> {
        Ok(self.reservations()?.into_iter().filter(|(_, h)| h.is(id, ifname)).map(|(ip, _)| ip).collect())
    }

    /// Releases every address of the attachment; releasing nothing is not an error. The
    /// attachment's record names them (each checked to be still its own); without one (an
    /// earlier build's ADD, a second DEL) every reservation is read.
    pub fn release(&self, id: &str, ifname: &str) -> CniResult<Vec<IpAddr>> {
        let ips = match self.recorded(id, ifname) {
            Some(recorded) => {
                recorded.into_iter().filter(|ip| self.holder(*ip).is_some_and(|h| h.is(id, ifname))).collect()
            }
            None => self.find(id, ifname)?,
        };
        for ip in &ips {
            self.remove(*ip)?;
        }
        self.forget(id, ifname)?;
        Ok(ips)
    }

    pub fn remove(&self, ip: IpAddr) -> CniResult<()> {
        match self.retire(&self.dir.join(ip.to_string())) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e).cni(ErrorCode::IO, format!("cannot release {ip}")),
            _ => Ok(()),
        }
    }
}

/// A reservation's address, from its file name; `None` for `lock`, `last_reserved_ip.*` and
/// temporary files.
fn parse_ip(name: &std::ffi::OsStr) -> Option<IpAddr> {
    name.to_str()?.parse().ok()
}

/// Who holds a reservation: container ID and interface name, or only the container ID in
/// host-local's format before CNI 0.4 (then it matches any interface of that container).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub container_id: String,
    pub ifname: Option<String>,
}

impl Holder {
    /// Content that is not UTF-8 parses as a torn holder.
    pub(super) fn parse(content: &[u8]) -> Self {
        let content = std::str::from_utf8(content).unwrap_or_default();
        let mut lines = content.lines().map(str::trim);
        let container_id = lines.next().unwrap_or_default().to_string();
        Self { container_id, ifname: lines.next().filter(|l| !l.is_empty()).map(str::to_string) }
    }

    /// No container ID: the file was created but its content never (fully) reached the disk.
    pub fn is_torn(&self) -> bool {
        self.container_id.is_empty()
    }

    pub fn is(&self, id: &str, ifname: &str) -> bool {
        self.container_id == id.trim() && self.ifname.as_deref().is_none_or(|i| i == ifname)
    }
}
