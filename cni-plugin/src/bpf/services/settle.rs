//! Sockets the socket LB sent to a backend that is gone. Neither kind may be left on it: a TCP
//! connection would hang until its own timeouts, and a connected UDP socket (a resolver's)
//! would send into the void for ever, since the kernel runs no `sock_addr` hook for a connected
//! socket's sends: the backend chosen at connect stays its peer. (kube-proxy's conntrack flush
//! and Cilium's socket LB both leave such UDP sockets stuck or failing.)
//!
//! Found with sock_diag in every network namespace that has a process (sockets live in the
//! pods' namespaces), and only those `SVC_SOCKETS` says the socket LB translated for this
//! frontend: a pod's own connection to the backend's address is left alone. An IPv4 frontend's
//! sockets include `AF_INET6` ones that dialled it IPv4-mapped (`::ffff:<ClusterIP>`, dual-stack
//! runtimes): their peer is the backend mapped, which `SVC_SOCKETS` holds in its IPv4 form.
//! - TCP: destroyed (`SOCK_DESTROY`): the backend, if alive, gets a RST, the application
//!   `ECONNABORTED` at once instead of a hang.
//! - Connected UDP: connected again to the Service, from here, on the application's own socket
//!   (a duplicate of its descriptor, `pidfd_getfd`). The socket LB's connect hook runs for the
//!   socket's cgroup and namespace, whoever calls, and picks a live backend; the application
//!   keeps its socket, its port and its reads, and `getpeername` still shows the Service.
//!   Where that is impossible (no backend left, the owner gone or not traceable), the socket is
//!   destroyed instead, so the application sees an error rather than silence.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::{IpAddr, SocketAddr},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::PathBuf,
};

use anyhow::Context as _;
use aya::maps::{HashMap, MapData};
use ebpf_common::{SocketKey, SocketService};
use nix::sched::{CloneFlags, setns};
use serde::Serialize;

use super::{Frontend, Maps, Protocol, backend_value, service_key};
use crate::bpf::Pins;
use crate::net::sock_diag::{Diag, DiagSocket, ESTABLISHED, LISTEN};

/// What settling did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Settled {
    /// Connected UDP sockets now connected to a live backend.
    pub reconnected: usize,
    /// Sockets destroyed (TCP; UDP that could not be connected again).
    pub destroyed: usize,
    /// Flows from the LAN (`SVC_CT`) to a removed backend, ended (`lan_flows.rs`).
    pub lan_flows: usize,
}

impl std::ops::AddAssign for Settled {
    fn add_assign(&mut self, other: Self) {
        self.reconnected += other.reconnected;
        self.destroyed += other.destroyed;
        self.lan_flows += other.lan_flows;
    }
}

/// Backends a change took away from a frontend: the sockets sent to them are to be settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub frontend: Frontend,
    pub backends: Vec<SocketAddr>,
    /// Reached from the LAN too (`SERVICE_EXTERNAL`): its `SVC_CT` flows are to be ended.
    pub external: bool,
}

/// The sockets of removed backends, settled apart from the writer (the agent's settling thread).
pub struct Settler {
    maps: Maps,
}

impl Settler {
    pub fn open(pins: &Pins) -> anyhow::Result<Self> {
        Ok(Self { maps: Maps::open(pins)? })
    }

    /// Settles the sockets sent to the backends `removals` took away, in one walk of the
    /// node's network namespaces, as the maps stand now: a backend a later change gave back
    /// to its frontend is left alone, and the sockets of a frontend that has backends again
    /// are connected again rather than destroyed.
    pub fn settle(&mut self, removals: &[Removal]) -> anyhow::Result<Settled> {
        settle(&mut self.maps, removals)
    }
}

pub(super) fn settle(maps: &mut Maps, removals: &[Removal]) -> anyhow::Result<Settled> {
    let jobs_now = jobs(maps, removals);
    let mut settled = sockets_of_removed(&mut maps.sockets, &jobs_now);
    // Asked again: the walk of the namespaces may have taken seconds, and a backend given back
    // meanwhile keeps its flows.
    let external: Vec<Job> = jobs(maps, removals).into_iter().filter(|j| j.external).collect();
    settled.lan_flows = super::lan_flows::end(maps, &external);
    Ok(settled)
}

/// The jobs `removals` make as the maps stand now. A frontend that cannot be read is left out
/// (logged), never the whole batch.
fn jobs(maps: &Maps, removals: &[Removal]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for removal in removals.iter().filter(|r| !r.backends.is_empty()) {
        let now = match maps.lookup(&service_key(removal.frontend)) {
            Ok(Some(service)) => maps.bank(&service),
            Ok(None) => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        let now = match now {
            Ok(now) => now,
            Err(e) => {
                log::warn!("services: frontend {:?} not settled: {e:#}", removal.frontend);
                continue;
            }
        };
        let removed: BTreeSet<SocketAddr> = removal.backends.iter().filter(|b| !now.contains(b)).copied().collect();
        if !removed.is_empty() {
            let (frontend, external, reconnect) = (removal.frontend, removal.external, !now.is_empty());
            jobs.push(Job { frontend, removed, reconnect, external });
        }
    }
    jobs
}

/// One frontend's sockets and flows to settle, as the maps stand when settling starts.
pub(super) struct Job {
    pub frontend: Frontend,
    /// Backends removed and not given back since.
    pub removed: BTreeSet<SocketAddr>,
    /// Whether connected UDP sockets may be connected again: the frontend still has backends
    /// (a removed Service's sockets are destroyed: there is nothing to connect them to).
    pub reconnect: bool,
    /// See [`Removal::external`].
    pub external: bool,
}

type Sockets = HashMap<MapData, SocketKey, SocketService>;

/// Settles every job's sockets in one walk of the node's network namespaces.
fn sockets_of_removed(sockets: &mut Sockets, jobs: &[Job]) -> Settled {
    let mut settled = Settled::default();
    if jobs.is_empty() {
        return settled;
    }
    for netns in namespaces() {
        let found = std::thread::scope(|scope| {
            scope
                .spawn(|| settle_in(&netns, &mut *sockets, jobs))
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("settling sockets in {} panicked", netns.display())))
        });
        match found {
            Ok(s) => settled += s,
            // A namespace that went away meanwhile has no socket left to settle.
            Err(e) => log::debug!("sockets in {}: {e:#}", netns.display()),
        }
    }
    settled
}

/// On a thread of its own, which it moves into `netns` (sock_diag answers for the caller's).
fn settle_in(netns: &PathBuf, sockets: &mut Sockets, jobs: &[Job]) -> anyhow::Result<Settled> {
    let ns = File::open(netns)?;
    setns(&ns, CloneFlags::CLONE_NEWNET).context("setns")?;
    let diag = Diag::open()?;
    let dumps: BTreeSet<(u8, u8)> = jobs.iter().flat_map(|j| kinds(j.frontend)).collect();
    // Each socket the socket LB sent to a removed backend of a job's frontend, with that job:
    // a pod's own connection to the backend's address is in no `SVC_SOCKETS` record.
    let mut stuck: Vec<(DiagSocket, &Job)> = Vec::new();
    for (family, protocol) in dumps {
        for socket in diag.dump(family, protocol)? {
            let backend = backend_of(&socket);
            let mut candidates = jobs.iter().filter(|j| kinds(j.frontend).contains(&(family, protocol)));
            // A socket no file holds (inode 0: TIME-WAIT, or orphaned by its application's
            // close) is a connection its application is done with: its timers end it.
            let closed = socket.inode == 0;
            if socket.state == LISTEN || closed || !candidates.clone().any(|j| j.removed.contains(&backend)) {
                continue;
            }
            let key = SocketKey { cookie: socket.cookie, backend: backend_value(backend), pad: 0 };
            let Ok(seen) = sockets.get(&key, 0) else { continue };
            if let Some(job) =
                candidates.find(|j| j.removed.contains(&backend) && seen.frontend == service_key(j.frontend))
            {
                stuck.push((socket, job));
            }
        }
    }
    let reconnects = |socket: &DiagSocket, job: &Job| {
        job.reconnect && job.frontend.protocol == Protocol::Udp && socket.state == ESTABLISHED
    };
    let owners = owners(stuck.iter().filter(|(s, j)| reconnects(s, j)).map(|(socket, _)| socket.inode));
    let mut settled = Settled::default();
    for (socket, job) in &stuck {
        let key = SocketKey { cookie: socket.cookie, backend: backend_value(backend_of(socket)), pad: 0 };
        if reconnects(socket, job) {
            let to = dialled(job.frontend, socket.family);
            match owners.get(&socket.inode).map(|&(pid, fd)| reconnect(pid, fd, socket.cookie, to)) {
                Some(Ok(())) => {
                    settled.reconnected += 1;
                    let _ = sockets.remove(&key);
                    continue;
                }
                Some(Err(e)) => {
                    log::info!("UDP socket {} → {}: cannot connect it again: {e:#}", socket.local, socket.peer)
                }
                None => log::info!("UDP socket {} → {}: no process holds it", socket.local, socket.peer),
            }
        }
        match diag.destroy(socket) {
            Ok(()) => {
                settled.destroyed += 1;
                let _ = sockets.remove(&key);
            }
            Err(e) => log::warn!("cannot destroy socket {} → {}: {e}", socket.local, socket.peer),
        }
    }
    Ok(settled)
}

/// The sock_diag families and protocol of a frontend's sockets: an IPv4 frontend's include
/// `AF_INET6` sockets that dialled it mapped.
fn kinds(frontend: Frontend) -> Vec<(u8, u8)> {
    let protocol = frontend.protocol.number();
    let v6 = (libc::AF_INET6 as u8, protocol);
    if frontend.ip.is_ipv4() { vec![(libc::AF_INET as u8, protocol), v6] } else { vec![v6] }
}

/// The backend a socket is on, as the writer names it: an `AF_INET6` socket's IPv4-mapped peer
/// as the IPv4 address it carries.
fn backend_of(socket: &DiagSocket) -> SocketAddr {
    SocketAddr::new(socket.peer.ip().to_canonical(), socket.peer.port())
}

/// The frontend as a socket of `family` dialled it: an IPv4 one mapped for `AF_INET6`, so the
/// socket is connected again the way its application did (through the IPv6 connect hook).
fn dialled(frontend: Frontend, family: u8) -> SocketAddr {
    match frontend.ip {
        IpAddr::V4(v4) if family == libc::AF_INET6 as u8 => SocketAddr::new(v4.to_ipv6_mapped().into(), frontend.port),
        ip => SocketAddr::new(ip, frontend.port),
    }
}

/// Connects the socket `fd` of process `pid` to its frontend `to` again (the connect hook picks),
/// once the descriptor duplicated is known to be that very socket: between the scan of
/// `/proc/<pid>/fd` and `pidfd_getfd` the process may have put another file at `fd` (a blocking
/// TCP socket would hold this thread for minutes), or the pid may be another process's.
fn reconnect(pid: i32, fd: i32, cookie: u64, to: SocketAddr) -> anyhow::Result<()> {
    // SAFETY: plain syscalls; each descriptor is owned once returned.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    anyhow::ensure!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    anyhow::ensure!(dup >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
    let dup = unsafe { OwnedFd::from_raw_fd(dup as i32) };
    let same = socket_option::<u64>(&dup, libc::SO_COOKIE) == Some(cookie)
        && socket_option::<libc::c_int>(&dup, libc::SO_TYPE) == Some(libc::SOCK_DGRAM)
        && socket_option::<libc::c_int>(&dup, libc::SO_PROTOCOL) == Some(libc::IPPROTO_UDP);
    anyhow::ensure!(same, "descriptor {fd} of process {pid} is no longer that UDP socket");
    let (storage, len) = sockaddr(to);
    // SAFETY: a valid sockaddr of `len` bytes.
    let rc = unsafe { libc::connect(dup.as_raw_fd(), (&raw const storage).cast(), len) };
    anyhow::ensure!(rc == 0, "connect: {}", std::io::Error::last_os_error());
    Ok(())
}

/// A `SOL_SOCKET` option of `fd`, or `None` if it cannot be read (not a socket).
fn socket_option<T: Default + Copy>(fd: &OwnedFd, option: libc::c_int) -> Option<T> {
    let mut value = T::default();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is `len` writable bytes.
    let rc =
        unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, option, (&raw mut value).cast(), &raw mut len) };
    (rc == 0 && len as usize == size_of::<T>()).then_some(value)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The (pid, fd) holding each socket of `inodes`, by inode, from `/proc/<pid>/fd`.
fn owners(inodes: impl Iterator<Item = u32>) -> BTreeMap<u32, (i32, i32)> {
    let wanted: BTreeSet<String> = inodes.map(|inode| format!("socket:[{inode}]")).collect();
    let mut found = BTreeMap::new();
    if wanted.is_empty() {
        return found;
    }
    for (pid, dir) in processes() {
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let target = target.to_string_lossy();
            if wanted.contains(target.as_ref())
                && let (Some(inode), Ok(fd)) = (
                    target.trim_start_matches("socket:[").trim_end_matches(']').parse().ok(),
                    fd.file_name().to_string_lossy().parse(),
                )
            {
                found.entry(inode).or_insert((pid, fd));
            }
        }
    }
    found
}

fn processes() -> impl Iterator<Item = (i32, PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
}

/// One `/proc/<pid>/ns/net` per network namespace that has a process.
fn namespaces() -> Vec<PathBuf> {
    let mut seen = BTreeSet::new();
    processes()
        .map(|(_, dir)| dir.join("ns/net"))
        .filter(|path| std::fs::metadata(path).is_ok_and(|m| seen.insert((m.dev(), m.ino()))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_socket_is_connected_again_to_the_ipv4_frontend_mapped() {
        let frontend = Frontend { ip: "10.96.0.10".parse().unwrap(), port: 53, protocol: Protocol::Udp };
        assert_eq!(dialled(frontend, libc::AF_INET6 as u8), "[::ffff:10.96.0.10]:53".parse().unwrap());
        assert_eq!(dialled(frontend, libc::AF_INET as u8), "10.96.0.10:53".parse().unwrap());
        let v6 = Frontend { ip: "fd00:96::10".parse().unwrap(), ..frontend };
        assert_eq!(dialled(v6, libc::AF_INET6 as u8), "[fd00:96::10]:53".parse().unwrap());
    }
}
