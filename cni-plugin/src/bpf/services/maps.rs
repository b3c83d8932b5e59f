//! The socket LB's pinned maps, open, and what both the writer and the settler read of them.
use std::net::SocketAddr;

use anyhow::Context as _;
use aya::maps::{HashMap, Map, MapData, MapError, MapInfo};
use ebpf_common::{Backend, BackendKey, Service, ServiceKey, SocketKey, SocketService, ipv4_in_16, names};

use super::{lan_flows::Flows, socket_addr};
use crate::bpf::{Pins, read};

pub(super) struct Maps {
    pub frontends: HashMap<MapData, ServiceKey, Service>,
    pub backends: HashMap<MapData, BackendKey, Backend>,
    pub sockets: HashMap<MapData, SocketKey, SocketService>,
    /// The per-packet path's flows (`SVC_CT`), whose flows to a removed backend are ended.
    pub flows: Flows,
    /// `SVC_CT`'s size: how many keys a walk of it may visit (an LRU's walk restarts when the
    /// key it stands on is evicted, so a flood could keep it from ending).
    pub flows_capacity: u32,
    /// The node's addresses the datapath serves NodePorts on (`nodeIP`, `nodeIPv6`), in the
    /// maps' 16-byte form.
    pub node_addrs: Vec<[u8; 16]>,
}

impl Maps {
    /// The network's pinned Service maps (present once its datapath is loaded).
    pub fn open(pins: &Pins) -> anyhow::Result<Self> {
        let open = |name: &str| -> anyhow::Result<Map> {
            let data = MapData::from_pin(pins.map(name))
                .with_context(|| format!("cannot open pinned {name}: is the network's datapath loaded?"))?;
            Ok(Map::from_map_data(data)?)
        };
        let settings = read::settings(pins)?;
        let node_addrs = [ipv4_in_16(settings.node_ipv4), settings.node_ipv6].into_iter().filter(|a| *a != [0; 16]);
        Ok(Self {
            frontends: HashMap::try_from(open(names::SVC_FRONTENDS)?)?,
            backends: HashMap::try_from(open(names::SVC_BACKENDS)?)?,
            sockets: HashMap::try_from(open(names::SVC_SOCKETS)?)?,
            flows: HashMap::try_from(open(names::SVC_CT)?)?,
            flows_capacity: MapInfo::from_pin(pins.map(names::SVC_CT))?.max_entries(),
            node_addrs: node_addrs.collect(),
        })
    }

    pub fn lookup(&self, key: &ServiceKey) -> anyhow::Result<Option<Service>> {
        match self.frontends.get(key, 0) {
            Ok(s) => Ok(Some(s)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e).context("cannot read SVC_FRONTENDS"),
        }
    }

    /// The backends `service` names: slots `0..count` of its bank.
    pub fn bank(&self, service: &Service) -> anyhow::Result<Vec<SocketAddr>> {
        (0..service.count)
            .map(|index| {
                let slot = BackendKey { service: service.id, index, bank: service.bank, pad: 0 };
                let backend = self.backends.get(&slot, 0).with_context(|| format!("backend slot {slot:?} missing"))?;
                socket_addr(&backend).context("a backend slot of no known family")
            })
            .collect()
    }
}
