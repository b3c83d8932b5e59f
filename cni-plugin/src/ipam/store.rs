//! host-local's on-disk layout, so an existing host-local data dir keeps working:
//! `<dataDir>/<network>/<ip>` holds `<containerID>\r\n<ifname>`, `last_reserved_ip.<set>` the
//! last address handed out from range set `<set>`, and `lock` is flocked around every change.
use std::{
    fs::{self, File, OpenOptions},
    io::{ErrorKind, Write},
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};

use crate::cni::{CniResult, Context, ErrorCode};

/// host-local separates ID and interface with CRLF; we write the same so both can read it.
const LINE_BREAK: &str = "\r\n";

pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Store {
    /// Opens (creating if needed) the network's directory and takes its lock until drop.
    pub fn lock(data_dir: &Path, network: &str) -> CniResult<Self> {
        let dir = data_dir.join(network);
        fs::create_dir_all(&dir).cni(ErrorCode::IO, format!("cannot create IPAM dir {}", dir.display()))?;
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

    /// Reserves `ip` for the attachment; `false` if it was already taken.
    pub fn reserve(&self, ip: Ipv4Addr, id: &str, ifname: &str, set: usize) -> CniResult<bool> {
        let path = self.dir.join(ip.to_string());
        let mut file = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e).cni(ErrorCode::IO, format!("cannot reserve {ip}")),
        };
        file.write_all(format!("{}{LINE_BREAK}{ifname}", id.trim()).as_bytes())
            .cni(ErrorCode::IO, format!("cannot write reservation {}", path.display()))?;
        fs::write(self.dir.join(format!("last_reserved_ip.{set}")), ip.to_string())
            .cni(ErrorCode::IO, "cannot record last reserved IP")?;
        Ok(true)
    }

    /// Creates and removes a file, which fails on a read-only or full filesystem.
    pub fn probe_writable(&self) -> CniResult<()> {
        let probe = self.dir.join(format!(".status-{}", std::process::id()));
        fs::write(&probe, b"").cni(ErrorCode::IO, format!("cannot write in {}", self.dir.display()))?;
        fs::remove_file(&probe).cni(ErrorCode::IO, "cannot remove the probe file")
    }

    pub fn last_reserved(&self, set: usize) -> Option<Ipv4Addr> {
        fs::read_to_string(self.dir.join(format!("last_reserved_ip.{set}"))).ok()?.trim().parse().ok()
    }

    pub fn is_reserved(&self, ip: Ipv4Addr) -> bool {
        self.dir.join(ip.to_string()).exists()
    }

    /// Every reservation: the address and who holds it.
    pub fn reservations(&self) -> CniResult<Vec<(Ipv4Addr, Holder)>> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir).cni(ErrorCode::IO, "cannot list IPAM dir")? {
            let entry = entry.cni(ErrorCode::IO, "cannot list IPAM dir")?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse::<Ipv4Addr>().ok()) else {
                continue;
            };
            let Ok(content) = fs::read_to_string(entry.path()) else { continue };
            found.push((ip, Holder::parse(&content)));
        }
        Ok(found)
    }

    /// The holder of one address, if it is reserved.
    pub fn holder(&self, ip: Ipv4Addr) -> Option<Holder> {
        fs::read_to_string(self.dir.join(ip.to_string())).ok().map(|c| Holder::parse(&c))
    }

    /// Every address reserved for the attachment.
    pub fn find(&self, id: &str, ifname: &str) -> CniResult<Vec<Ipv4Addr>> {
        Ok(self.reservations()?.into_iter().filter(|(_, h)| h.is(id, ifname)).map(|(ip, _)| ip).collect())
    }

    /// Releases every address of the attachment; releasing nothing is not an error.
    pub fn release(&self, id: &str, ifname: &str) -> CniResult<Vec<Ipv4Addr>> {
        let ips = self.find(id, ifname)?;
        for ip in &ips {
            self.remove(*ip)?;
        }
        Ok(ips)
    }

    pub fn remove(&self, ip: Ipv4Addr) -> CniResult<()> {
        match fs::remove_file(self.dir.join(ip.to_string())) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e).cni(ErrorCode::IO, format!("cannot release {ip}")),
            _ => Ok(()),
        }
    }
}

/// Who holds a reservation: container ID and interface name, or only the container ID in
/// host-local's format before CNI 0.4 (then it matches any interface of that container).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub container_id: String,
    pub ifname: Option<String>,
}

impl Holder {
    fn parse(content: &str) -> Self {
        let mut lines = content.lines().map(str::trim);
        let container_id = lines.next().unwrap_or_default().to_string();
        Self { container_id, ifname: lines.next().filter(|l| !l.is_empty()).map(str::to_string) }
    }

    pub fn is(&self, id: &str, ifname: &str) -> bool {
        self.container_id == id.trim() && self.ifname.as_deref().is_none_or(|i| i == ifname)
    }
}
