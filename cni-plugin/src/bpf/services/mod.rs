//! The Service writer: Services into the socket LB's pinned maps (layout and the reader's side
//! in `ebpf-common/src/service.rs`). One Service's change is a few map writes, never a rewrite:
//! its new backends go into the bank of slots readers are not using, then one update of its
//! frontend entry switches them over (readers copy that entry whole, so they see the old set
//! or the new one, never a mix), and the slots the new set does not use in that bank are
//! deleted. The bank left keeps the previous set until the next change, for a reader that
//! copied the old entry just before the switch.
//!
//! A change that removes backends returns them ([`Removal`]); [`ServiceWriter::settle`] then
//! settles the sockets the socket LB sent to them (`settle.rs`): TCP connections are destroyed
//! (their peer gets a RST, the application `ECONNABORTED`), connected UDP sockets are connected
//! again to their Service (a live backend). The agent settles on a thread of its own, after the
//! batch's map writes, so that no map write waits for a walk of the node's sockets.
pub mod cli;
mod lan_flows;
mod maps;
mod settle;

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use aya::maps::MapError;
use ebpf_common::{
    Backend, BackendKey, FAMILY_IPV4, FAMILY_IPV6, SERVICE_AFFINITY, SERVICE_EXTERNAL, SERVICE_EXTERNAL_LOCAL,
    SERVICE_MAX_BACKENDS, Service, ServiceKey, ipv4_in_16,
};
use serde::Serialize;

use super::pins::Pins;

use maps::Maps;
pub use settle::{Removal, Settled, Settler};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => 6,
            Self::Udp => 17,
        }
    }

    fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(Self::Tcp),
            17 => Some(Self::Udp),
            _ => None,
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Self::Tcp),
            "udp" => Ok(Self::Udp),
            _ => bail!("protocol {s:?}: tcp or udp"),
        }
    }
}

/// What an application addresses: a Service's address, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Frontend {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

/// One Service as the maps hold it.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceView {
    pub frontend: Frontend,
    pub backends: Vec<SocketAddr>,
    /// `sessionAffinity: ClientIP`'s timeout, when set.
    #[serde(with = "affinity_seconds")]
    pub affinity: Option<Duration>,
    pub revision: u32,
    /// Reached per packet from the LAN (NodePort, LoadBalancer IP, externalIP).
    pub external: bool,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
}

/// How a frontend is reached from outside the node's sockets. A frontend whose address is
/// unspecified (`0.0.0.0`, `::`) is a NodePort, "this port on the node's address", and always
/// external.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exposure {
    /// Translated per packet from the uplink (a NodePort, a LoadBalancer ingress IP, an
    /// externalIP), besides the socket LB.
    pub external: bool,
    /// `externalTrafficPolicy: Local`: the backends given are this node's only (the caller
    /// filters them by `nodeName`), the client's address is kept; none given: the node does
    /// not forward (dropped, counted). A Service with no endpoint on any node must be written
    /// without it, so that it is rejected at once as kube-proxy does.
    pub local: bool,
}

mod affinity_seconds {
    pub fn serialize<S: serde::Serializer>(v: &Option<std::time::Duration>, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&v.map(|d| d.as_secs()), s)
    }
}

pub struct ServiceWriter {
    maps: Maps,
    /// Service ids only count up, so a reader racing a removal never finds another Service's
    /// backends under the id it copied.
    next_id: u32,
}

impl ServiceWriter {
    /// Opens the network's pinned Service maps (present once its datapath is loaded).
    pub fn open(pins: &Pins) -> anyhow::Result<Self> {
        let maps = Maps::open(pins)?;
        let next_id = maps.frontends.iter().filter_map(Result::ok).map(|(_, s)| s.id + 1).max().unwrap_or(1);
        Ok(Self { maps, next_id })
    }

    /// Sets `frontend`'s backends (all of its family; none: connects are refused) and its
    /// ClientIP affinity timeout. Returns the backends this removed, whose sockets are to be
    /// settled ([`Self::settle`]).
    pub fn upsert(
        &mut self,
        frontend: Frontend,
        backends: &[SocketAddr],
        affinity: Option<Duration>,
    ) -> anyhow::Result<Removal> {
        self.upsert_exposed(frontend, backends, affinity, Exposure::default())
    }

    /// [`Self::upsert`] for a frontend reached from outside too (see [`Exposure`]).
    pub fn upsert_exposed(
        &mut self,
        frontend: Frontend,
        backends: &[SocketAddr],
        affinity: Option<Duration>,
        exposure: Exposure,
    ) -> anyhow::Result<Removal> {
        ensure!(backends.len() as u32 <= SERVICE_MAX_BACKENDS, "more than {SERVICE_MAX_BACKENDS} backends");
        let family = family(frontend.ip);
        if let Some(other) = backends.iter().find(|b| self::family(b.ip()) != family) {
            bail!("backend {other} is not of the frontend's family ({})", frontend.ip);
        }
        let key = service_key(frontend);
        let current = self.maps.lookup(&key)?;
        let (id, revision) = match current {
            Some(s) => (s.id, s.revision.wrapping_add(1)),
            None => {
                self.next_id += 1;
                (self.next_id - 1, 0)
            }
        };
        let bank = (revision & 1) as u8;
        for (index, backend) in backends.iter().enumerate() {
            let slot = BackendKey { service: id, index: index as u16, bank, pad: 0 };
            self.maps.backends.insert(slot, backend_value(*backend), 0).context("cannot write a backend slot")?;
        }
        self.clear_bank(id, bank, backends.len() as u16)?;
        let timeout = affinity.map_or(0, |t| t.as_secs().clamp(1, u64::from(u32::MAX)) as u32);
        let service = Service {
            id,
            revision,
            count: backends.len() as u16,
            flags: flags(frontend, affinity, exposure),
            bank,
            affinity_timeout_s: timeout,
        };
        // The switch: readers now pick from the new bank.
        self.maps.frontends.insert(key, service, 0).context("cannot write the frontend (SVC_FRONTENDS full?)")?;
        // Flows from the LAN that the frontend served before this change are ended too.
        let external =
            service.flags & SERVICE_EXTERNAL != 0 || current.is_some_and(|c| c.flags & SERVICE_EXTERNAL != 0);
        let Some(previous) = current else { return Ok(Removal { frontend, backends: Vec::new(), external }) };
        let kept: BTreeSet<SocketAddr> = backends.iter().copied().collect();
        let removed: Vec<SocketAddr> = self.maps.bank(&previous)?.into_iter().filter(|b| !kept.contains(b)).collect();
        Ok(Removal { frontend, backends: removed, external })
    }

    /// Removes `frontend` and its backend slots. Returns its backends, whose sockets are to be
    /// settled (destroyed: there is no backend to connect them to), or `None` when it did not
    /// exist.
    pub fn remove(&mut self, frontend: Frontend) -> anyhow::Result<Option<Removal>> {
        let key = service_key(frontend);
        let Some(service) = self.maps.lookup(&key)? else { return Ok(None) };
        let backends = self.maps.bank(&service)?;
        // The frontend first: from here no reader picks a slot of this Service.
        self.maps.frontends.remove(&key).context("cannot remove the frontend")?;
        for bank in 0..2 {
            self.clear_bank(service.id, bank, 0)?;
        }
        Ok(Some(Removal { frontend, backends, external: service.flags & SERVICE_EXTERNAL != 0 }))
    }

    /// Settles the sockets sent to the backends `removals` took away ([`Settler::settle`]).
    pub fn settle(&mut self, removals: &[Removal]) -> anyhow::Result<Settled> {
        settle::settle(&mut self.maps, removals)
    }

    /// Every Service in the maps, sorted by frontend.
    pub fn list(&self) -> anyhow::Result<Vec<ServiceView>> {
        let mut all = Vec::new();
        for entry in self.maps.frontends.iter() {
            let (key, service) = entry.context("cannot read SVC_FRONTENDS")?;
            let Some(frontend) = frontend_of(&key) else { continue };
            let affinity = (service.flags & SERVICE_AFFINITY != 0)
                .then(|| Duration::from_secs(u64::from(service.affinity_timeout_s)));
            all.push(ServiceView {
                frontend,
                backends: self.maps.bank(&service)?,
                affinity,
                revision: service.revision,
                external: service.flags & SERVICE_EXTERNAL != 0,
                local: service.flags & SERVICE_EXTERNAL_LOCAL != 0,
            });
        }
        all.sort_by_key(|s| s.frontend);
        Ok(all)
    }

    /// Deletes `bank`'s slots from index `from` on (slots are contiguous from 0).
    fn clear_bank(&mut self, service: u32, bank: u8, from: u16) -> anyhow::Result<()> {
        for index in from..=u16::MAX {
            match self.maps.backends.remove(&BackendKey { service, index, bank, pad: 0 }) {
                Ok(()) => {}
                // aya reports a missing key on delete as the syscall's ENOENT.
                Err(MapError::KeyNotFound) => break,
                Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => break,
                Err(e) => return Err(e).context("cannot delete a backend slot"),
            }
        }
        Ok(())
    }
}

/// `Service::flags` for a frontend.
fn flags(frontend: Frontend, affinity: Option<Duration>, exposure: Exposure) -> u8 {
    let mut flags = if affinity.is_some() { SERVICE_AFFINITY } else { 0 };
    if exposure.external || frontend.ip.is_unspecified() {
        flags |= SERVICE_EXTERNAL;
        if exposure.local {
            flags |= SERVICE_EXTERNAL_LOCAL;
        }
    }
    flags
}

fn family(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { FAMILY_IPV4 } else { FAMILY_IPV6 }
}

fn addr16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => ipv4_in_16(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_of(addr: [u8; 16], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_IPV4 => Some(IpAddr::from([addr[0], addr[1], addr[2], addr[3]])),
        FAMILY_IPV6 => Some(IpAddr::from(addr)),
        _ => None,
    }
}

pub(crate) fn service_key(f: Frontend) -> ServiceKey {
    ServiceKey { addr: addr16(f.ip), port: f.port, protocol: f.protocol.number(), family: family(f.ip) }
}

fn frontend_of(key: &ServiceKey) -> Option<Frontend> {
    Some(Frontend { ip: ip_of(key.addr, key.family)?, port: key.port, protocol: Protocol::from_number(key.protocol)? })
}

pub(crate) fn backend_value(b: SocketAddr) -> Backend {
    Backend { addr: addr16(b.ip()), port: b.port(), family: family(b.ip()), pad: 0 }
}

fn socket_addr(b: &Backend) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip_of(b.addr, b.family)?, b.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hold_the_address_in_the_first_bytes_and_ports_in_host_order() {
        let f = Frontend { ip: "10.96.0.10".parse().unwrap(), port: 53, protocol: Protocol::Udp };
        let key = service_key(f);
        assert_eq!((&key.addr[..4], key.port, key.protocol, key.family), (&[10, 96, 0, 10][..], 53, 17, 4));
        assert_eq!(frontend_of(&key), Some(f));
        let b: SocketAddr = "[fd00::5]:8080".parse().unwrap();
        assert_eq!(socket_addr(&backend_value(b)), Some(b));
    }
}
