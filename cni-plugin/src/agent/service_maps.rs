//! The Service model's changes into the socket LB's pinned maps (`bpf::services`), the sink the
//! agent's Service thread hands them to. The maps exist while the primary network's datapath is
//! loaded (the agent loads it ahead of the first pod); the last pod's DEL unloads it and the
//! agent loads it again, empty. So the sink keeps the whole desired state, not only the batch:
//! whenever it (re)opens the maps it writes every frontend and removes what the model does not
//! hold (an agent restart finds the previous agent's entries still serving: nothing flaps, since
//! nothing is written before the model has both first lists), and after that only the changes.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    time::{Duration, Instant},
};

use ebpf_common::names;

use crate::{
    bpf::{
        Pins,
        services::{self as maps, ServiceWriter},
    },
    services::{Entry, Frontend, LogSink, Protocol, ServiceSink},
};

/// How often, with no change to write, the sink checks that its maps are still the pinned
/// ones (a datapath loaded again has new, empty maps).
const RECHECK: Duration = Duration::from_secs(1);

pub struct MapSink {
    pins: Pins,
    desired: BTreeMap<Frontend, Entry>,
    /// The frontends changed since the last write.
    pending: BTreeMap<Frontend, Option<Entry>>,
    /// The open writer, with the inode of the `SVC_FRONTENDS` pin it opened.
    writer: Option<(ServiceWriter, u64)>,
    checked: Instant,
    log: LogSink,
}

impl MapSink {
    pub fn new(pins: Pins) -> Self {
        let log = LogSink::default();
        Self { pins, desired: BTreeMap::new(), pending: BTreeMap::new(), writer: None, checked: Instant::now(), log }
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
        for (frontend, entry) in pending {
            if let Err(e) = self.apply(&frontend, entry.as_ref()) {
                log::error!("services: frontend {frontend}: {e:#}; writing every frontend again");
                self.writer = None;
                return;
            }
        }
    }

    /// Every desired frontend written, every other one in the maps removed.
    fn resync(&mut self) -> anyhow::Result<()> {
        let Some((writer, _)) = &mut self.writer else { return Ok(()) };
        let stale: Vec<maps::Frontend> =
            writer.list()?.into_iter().map(|s| s.frontend).filter(|f| !self.desired.contains_key(&ours(*f))).collect();
        for frontend in stale {
            writer.remove(frontend)?;
        }
        let desired: Vec<(Frontend, Entry)> = self.desired.iter().map(|(f, e)| (*f, e.clone())).collect();
        for (frontend, entry) in &desired {
            self.apply(frontend, Some(entry))?;
        }
        log::info!("services: wrote all {} frontends into the socket LB's maps", desired.len());
        Ok(())
    }

    fn apply(&mut self, frontend: &Frontend, entry: Option<&Entry>) -> anyhow::Result<()> {
        let Some((writer, _)) = &mut self.writer else { return Ok(()) };
        let theirs = theirs(*frontend);
        let settled = match entry {
            None => writer.remove(theirs)?.unwrap_or_default(),
            Some(entry) => {
                // Local sockets are this node's own clients: an external frontend with
                // `externalTrafficPolicy: Local` sends them to every endpoint (`internal`).
                let backends = entry.internal.as_ref().unwrap_or(&entry.backends);
                let backends: Vec<SocketAddr> = backends.iter().map(|b| SocketAddr::new(b.addr, b.port)).collect();
                let affinity = entry.affinity_seconds.map(|s| Duration::from_secs(u64::from(s)));
                writer.upsert(theirs, &backends, affinity)?
            }
        };
        if settled != maps::Settled::default() {
            log::info!("services: frontend {frontend}: sockets on removed backends settled: {settled:?}");
        }
        Ok(())
    }
}

impl ServiceSink for MapSink {
    fn upsert(&mut self, frontend: &Frontend, entry: &Entry) {
        self.log.upsert(frontend, entry);
        self.desired.insert(*frontend, entry.clone());
        self.pending.insert(*frontend, Some(entry.clone()));
    }

    fn remove(&mut self, frontend: &Frontend) {
        self.log.remove(frontend);
        self.desired.remove(frontend);
        self.pending.insert(*frontend, None);
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

fn ours(f: maps::Frontend) -> Frontend {
    let protocol = match f.protocol {
        maps::Protocol::Tcp => Protocol::Tcp,
        maps::Protocol::Udp => Protocol::Udp,
    };
    Frontend { addr: f.ip, port: f.port, protocol }
}
