//! The control plane's side of the per-flow maps (`NAT`, `FLOWS`): forgetting a pod's flows when
//! it goes, so that a late packet finds no state (and never reaches the next pod given the same
//! address).
use aya::{
    Pod,
    maps::{HashMap, Map, MapData},
};
use ebpf_common::{FlowEntry, FlowKey, NatEntry, names};

use super::datapath::Datapath;
use crate::cni::{CniResult, Context, ErrorCode};

impl Datapath {
    /// Removes both entries of every masqueraded flow `owner`'s pod had; returns how many.
    pub fn remove_nat(&self, owner: u64) -> CniResult<usize> {
        self.remove_nat_where(|o| o == owner)
    }

    /// Removes both entries of every flow whose owner `stale` picks, and those owners' flow
    /// counts; returns how many entries.
    pub fn remove_nat_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        let removed = self.remove_owned::<NatEntry>(names::NAT, |entry| entry.owner, &stale)?;
        self.remove_pod_flows_where(&stale)?;
        Ok(removed)
    }

    /// Removes the `POD_FLOWS` counts of the owners `stale` picks.
    fn remove_pod_flows_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<()> {
        let path = self.pins.map(names::POD_FLOWS);
        if !path.exists() {
            return Ok(());
        }
        let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, "cannot open pinned POD_FLOWS")?;
        let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned POD_FLOWS")?;
        let mut map: HashMap<_, u64, ebpf_common::PodFlows> =
            HashMap::try_from(map).cni(ErrorCode::DATAPATH, "pinned POD_FLOWS has another layout")?;
        let owners: Vec<u64> = map.keys().filter_map(Result::ok).filter(|o| stale(*o)).collect();
        for owner in owners {
            let _ = map.remove(&owner);
        }
        Ok(())
    }

    /// Removes what `FLOWS` knows of `owner`'s pod's flows; returns how many entries.
    pub fn remove_flows(&self, owner: u64) -> CniResult<usize> {
        self.remove_flows_where(|o| o == owner)
    }

    pub fn remove_flows_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        self.remove_owned::<FlowEntry>(names::FLOWS, |entry| entry.owner, stale)
    }

    /// Removes the entries of the pinned flow map `name` whose owner `stale` picks.
    fn remove_owned<V: Pod>(&self, name: &str, owner: fn(&V) -> u64, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        let path = self.pins.map(name);
        if !path.exists() {
            return Ok(0);
        }
        let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
        let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
        let mut map: HashMap<_, FlowKey, V> =
            HashMap::try_from(map).cni(ErrorCode::DATAPATH, format!("pinned {name} has another layout"))?;
        let keys: Vec<FlowKey> =
            map.iter().filter_map(Result::ok).filter(|(_, entry)| stale(owner(entry))).map(|(k, _)| k).collect();
        // An entry the LRU evicted meanwhile is already gone: not an error.
        let removed = keys.iter().filter(|key| map.remove(key).is_ok()).count();
        Ok(removed)
    }
}
