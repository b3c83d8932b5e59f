//! The Service model's changes into the socket LB's pinned maps (`bpf::services`), the sink the
//! agent's Service thread hands them to. The maps exist while the primary network's datapath is
//! loaded (the agent loads it ahead of the first pod); the last pod's DEL unloads it and the
//! agent loads it again, empty. So the sink keeps the whole desired state, not only the batch:
//! whenever it (re)opens the maps it writes every frontend and removes what the model does not
//! hold (an agent restart finds the previous agent's entries still serving: nothing flaps, since
//! nothing is written before the model has both first lists), and after that only the changes.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    os::unix::fs::MetadataExt as _,
    sync::mpsc::Sender,
    time::{Duration, Instant},
};

use ebpf_common::names;

use crate::{
    bpf::{
        Pins,
        services::{self as maps, Exposure, ServiceWriter},
    },
    services::{Entry, Frontend, Kind, LogSink, Protocol, ServiceSink, WhenEmpty},
};

/// How often, with no change to write, the sink checks that its maps are still the pinned
/// ones (a datapath loaded again has new, empty maps).
const RECHECK: Duration = Duration::from_secs(1);

pub struct MapSink {
    pins: Pins,
    /// The model's frontends, as the maps must hold them.
    desired: BTreeMap<Frontend, Entry>,
    /// The map keys changed since the last write: what each must hold now, or nothing.
    pending: BTreeMap<maps::Frontend, Option<Target>>,
    /// The open writer, with the inode of the `SVC_FRONTENDS` pin it opened.
    writer: Option<(ServiceWriter, u64)>,
    checked: Instant,
    log: LogSink,
    /// Frontends that could not be written (logged each time).
    failures: u64,
    /// Backends the writes since the last hand-over took away: their sockets are to settle.
    removals: Vec<maps::Removal>,
    /// Per map key, backends that were draining (out of the maps already, their connections
    /// left to finish) and are now gone from the slices: settled with the key's next write.
    ended: BTreeMap<maps::Frontend, BTreeSet<SocketAddr>>,
    settler: Sender<Vec<maps::Removal>>,
}

/// What one map key holds.
#[derive(Clone)]
struct Target {
    backends: Vec<SocketAddr>,
    affinity: Option<Duration>,
    exposure: Exposure,
    /// Backends still listed but taking no new connection: their connections are not settled.
    draining: Vec<SocketAddr>,
}

impl MapSink {
    pub fn new(pins: Pins) -> Self {
        let log = LogSink::default();
        let (desired, pending) = (BTreeMap::new(), BTreeMap::new());
        let settler = super::settling::start(pins.clone());
        let (checked, removals, ended) = (Instant::now(), Vec::new(), BTreeMap::new());
        Self { pins, desired, pending, writer: None, checked, log, failures: 0, removals, ended, settler }
    }

    /// The inode of the pinned frontend map: a new load pins a new map at the same path.
    fn pinned_inode(&self) -> Option<u64> {
        std::fs::metadata(self.pins.map(names::SVC_FRONTENDS)).ok().map(|m| m.ino())
    }

    /// Writes what is due: everything after (re)opening the maps, else the pending changes.
    fn write(&mut self) {
        let inode = self.pinned_inode();
        if self.writer.as_ref().map(|(_, at)| Some(*at)) != Some(inode) {
            self.writer = None;
        }
        if self.writer.is_none() {
            let Some(inode) = inode else { return };
            match ServiceWriter::open(&self.pins) {
                Ok(writer) => self.writer = Some((writer, inode)),
                Err(e) => {
                    log::warn!("services: the socket LB's maps cannot be opened yet: {e:#}");
                    return;
                }
            }
            if let Err(e) = self.resync() {
                log::error!("services: writing every frontend failed: {e:#}; trying again");
                self.writer = None;
            }
            self.pending.clear();
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        for (key, target) in pending {
            self.apply_logged(key, target.as_ref());
        }
        self.hand_over_removals();
    }

    /// The batch's map writes are done: its removed backends' sockets go to the settling thread.
    fn hand_over_removals(&mut self) {
        let removals: Vec<maps::Removal> =
            std::mem::take(&mut self.removals).into_iter().filter(|r| !r.backends.is_empty()).collect();
        if !removals.is_empty() {
            let _ = self.settler.send(removals);
        }
    }

    /// Every desired key written, every other one in the maps removed (never one that stays:
    /// the Services keep serving while the agent writes them again).
    fn resync(&mut self) -> anyhow::Result<()> {
        let targets: BTreeMap<maps::Frontend, Target> = self.desired.iter().map(|(f, e)| target(f, e)).collect();
        let Some((writer, _)) = &mut self.writer else { return Ok(()) };
        let stale: Vec<maps::Frontend> =
            writer.list()?.into_iter().map(|s| s.frontend).filter(|f| !targets.contains_key(f)).collect();
        for frontend in stale {
            self.removals.extend(writer.remove(frontend)?);
        }
        // One frontend that cannot be written (a full map) is logged and left out: the others
        // are written all the same, never held up behind it.
        for (key, target) in &targets {
            self.apply_logged(*key, Some(target));
        }
        log::info!("services: wrote all {} frontends into the socket LB's maps", targets.len());
        self.hand_over_removals();
        Ok(())
    }

    fn apply_logged(&mut self, key: maps::Frontend, target: Option<&Target>) {
        if let Err(e) = self.apply(key, target) {
            self.failures += 1;
            log::error!("services: frontend {key:?} not written: {e:#}");
        }
    }

    fn apply(&mut self, key: maps::Frontend, target: Option<&Target>) -> anyhow::Result<()> {
        let Some((writer, _)) = &mut self.writer else { return Ok(()) };
        let removal = match target {
            None => writer.remove(key)?,
            Some(t) => {
                let mut removal = writer.upsert_exposed(key, &t.backends, t.affinity, t.exposure)?;
                removal.backends.retain(|b| !t.draining.contains(b));
                Some(removal)
            }
        };
        let ended = self.ended.remove(&key).unwrap_or_default();
        self.removals.extend(removal.map(|mut r| {
            let ended: Vec<SocketAddr> = ended.into_iter().filter(|b| !r.backends.contains(b)).collect();
            r.backends.extend(ended);
            r
        }));
        Ok(())
    }
}

/// The map key and contents for the model's `frontend`.
/// - A ClusterIP: the socket LB only; for this node's own clients, so an internal traffic policy
///   of Local is already in `backends`.
/// - A NodePort: the key "any node address" of its family (the per-packet path from the LAN
///   serves every node address with it, the socket LB looks it up for a connect to the node's
///   own address); an external one, with `externalTrafficPolicy: Local` its local backends only
///   (a hairpin from this node then meets that choice too, where kube-proxy would give it every
///   endpoint: one key cannot hold both lists).
/// - A LoadBalancer ingress IP or an externalIP: its own address, external, as a NodePort.
fn target(frontend: &Frontend, entry: &Entry) -> (maps::Frontend, Target) {
    let mut key = theirs(*frontend);
    if entry.kind == Kind::NodePort {
        key.ip = if key.ip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    }
    let backends: Vec<SocketAddr> = entry.backends.iter().map(|b| SocketAddr::new(b.addr, b.port)).collect();
    // Local only when that is the choice made: a Service with no endpoint anywhere is written
    // without it, so that it is refused at once rather than dropped.
    let local = entry.local_only && !(backends.is_empty() && entry.when_empty == WhenEmpty::Reject);
    let exposure = Exposure { external: entry.kind.external(), local: entry.kind.external() && local };
    let affinity = entry.affinity_seconds.map(|s| Duration::from_secs(u64::from(s)));
    let draining = entry.draining.iter().map(|b| SocketAddr::new(b.addr, b.port)).collect();
    (key, Target { backends, affinity, exposure, draining })
}

impl ServiceSink for MapSink {
    fn upsert(&mut self, frontend: &Frontend, entry: &Entry) {
        self.log.upsert(frontend, entry);
        let (key, target) = target(frontend, entry);
        if let Some(old) = self.desired.insert(*frontend, entry.clone()) {
            let stays = |b: &SocketAddr| target.backends.contains(b) || target.draining.contains(b);
            let gone = old.draining.iter().map(|b| SocketAddr::new(b.addr, b.port)).filter(|b| !stays(b));
            self.ended.entry(key).or_default().extend(gone);
        }
        self.pending.insert(key, Some(target));
    }

    fn remove(&mut self, frontend: &Frontend) {
        self.log.remove(frontend);
        let Some(entry) = self.desired.remove(frontend) else { return };
        let (key, _) = target(frontend, &entry);
        let draining = entry.draining.iter().map(|b| SocketAddr::new(b.addr, b.port));
        self.ended.entry(key).or_default().extend(draining);
        // Another node address's NodePort shares the key: it stays.
        if !self.desired.iter().any(|(f, e)| target(f, e).0 == key) {
            self.pending.insert(key, None);
        }
    }

    fn flush(&mut self) {
        self.write();
        self.checked = Instant::now();
        self.log.flush();
    }

    fn idle(&mut self) {
        if self.checked.elapsed() >= RECHECK {
            self.checked = Instant::now();
            self.write();
        }
    }
}

fn theirs(f: Frontend) -> maps::Frontend {
    let protocol = match f.protocol {
        Protocol::Tcp => maps::Protocol::Tcp,
        Protocol::Udp => maps::Protocol::Udp,
    };
    maps::Frontend { ip: f.addr, port: f.port, protocol }
}
