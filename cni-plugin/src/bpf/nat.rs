//! The control plane's side of the per-flow maps (`NAT`, `FLOWS`, `POD_FLOWS`): forgetting a
//! pod's flows when it goes, so that a late packet finds no state (and never reaches the next pod
//! given the same address).
//!
//! Programs that check owners (`FEATURE_OWNER_CHECKS`) already ignore a gone pod's entries, and
//! masquerade may take their ports, so DEL removes only its `POD_FLOWS` entry (one key) and
//! leaves its flows to age in the LRU maps: a scan of full `NAT` and `FLOWS` maps costs a third
//! of a second, and DEL holds the node's lock. GC sweeps them after it has let the lock go
//! ([`sweep_flows`]). For programs of a build before them, DEL and GC still purge under the lock.
use std::collections::BTreeSet;

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData},
};
use ebpf_common::{FEATURE_OWNER_CHECKS, FlowEntry, FlowKey, NatEntry, PodFlows, names};

use super::{datapath::Datapath, pins::Pins, read};
use crate::cni::{CniResult, Context, ErrorCode};

impl Datapath {
    /// Whether the loaded programs ignore entries whose owner no longer holds their address.
    pub fn checks_owners(&self) -> bool {
        checks_owners(&self.pins)
    }

    /// Forgets what DEL must of `owner`'s flows: its `POD_FLOWS` entry when the programs check
    /// owners, otherwise every entry of it in `NAT`, `FLOWS` and `POD_FLOWS`. Returns how many
    /// `NAT` and `FLOWS` entries went.
    pub fn forget_flows(&self, owner: u64) -> CniResult<usize> {
        if self.checks_owners() {
            if let Some(mut counts) = open::<u64, PodFlows>(&self.pins, names::POD_FLOWS)? {
                let _ = counts.remove(&owner);
            }
            return Ok(0);
        }
        Ok(self.remove_nat_where(|o| o == owner)? + self.remove_flows_where(|o| o == owner)?)
    }

    /// Removes both entries of every flow whose owner `stale` picks, and those owners' flow
    /// counts; returns how many entries.
    pub fn remove_nat_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        let removed = remove_owned::<NatEntry>(&self.pins, names::NAT, |entry| entry.owner, &stale)?;
        self.remove_pod_flows_where(&stale)?;
        Ok(removed)
    }

    /// Removes the `POD_FLOWS` counts of the owners `stale` picks (one entry per masquerading
    /// pod: a small map).
    pub fn remove_pod_flows_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<()> {
        let Some(mut map) = open::<u64, PodFlows>(&self.pins, names::POD_FLOWS)? else { return Ok(()) };
        let owners: Vec<u64> = map.keys().filter_map(Result::ok).filter(|o| stale(*o)).collect();
        for owner in owners {
            let _ = map.remove(&owner);
        }
        Ok(())
    }

    pub fn remove_flows_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        remove_owned::<FlowEntry>(&self.pins, names::FLOWS, |entry| entry.owner, stale)
    }
}

/// Whether the programs pinned at `pins` check owners (the `FEATURES` map; builds before it
/// have none: no).
fn checks_owners(pins: &Pins) -> bool {
    let Ok(data) = MapData::from_pin(pins.map(names::FEATURES)) else { return false };
    let Ok(Ok(array)) = Map::from_map_data(data).map(Array::<_, u64>::try_from) else { return false };
    array.get(&0, 0).is_ok_and(|bits| bits & FEATURE_OWNER_CHECKS != 0)
}

/// Removes the `NAT` and `FLOWS` entries of owners that hold no endpoint, without the node's
/// lock (GC, after it let the lock go): to programs that check owners such entries are only
/// room taken. An owner is judged against the endpoints read after the scan, so an attachment
/// added meanwhile (its endpoint is written before any flow of it exists) keeps its flows.
/// Returns how many `NAT` and `FLOWS` entries went; nothing when the programs do not check
/// owners (GC purged under the lock) or the network's pins are gone.
pub fn sweep_flows(pins: &Pins) -> CniResult<(usize, usize)> {
    if !checks_owners(pins) {
        return Ok((0, 0));
    }
    let nat = collect_owned::<NatEntry>(pins, names::NAT, |e| e.owner)?;
    let flows = collect_owned::<FlowEntry>(pins, names::FLOWS, |e| e.owner)?;
    let live: BTreeSet<u64> = read::endpoint_entries(pins)
        .cni(ErrorCode::DATAPATH, "cannot read ENDPOINTS")?
        .into_iter()
        .map(|(_, endpoint)| endpoint.owner)
        .collect();
    let stale = |owner: &u64| !live.contains(owner);
    Ok((
        remove_keys::<NatEntry>(pins, names::NAT, &nat, stale)?,
        remove_keys::<FlowEntry>(pins, names::FLOWS, &flows, stale)?,
    ))
}

/// Removes the entries of the pinned flow map `name` whose owner `stale` picks.
fn remove_owned<V: Pod>(
    pins: &Pins,
    name: &str,
    owner: fn(&V) -> u64,
    stale: impl Fn(u64) -> bool,
) -> CniResult<usize> {
    let keys = collect_owned::<V>(pins, name, owner)?;
    remove_keys::<V>(pins, name, &keys, |o| stale(*o))
}

/// Every key of the pinned flow map `name` with its entry's owner.
fn collect_owned<V: Pod>(pins: &Pins, name: &str, owner: fn(&V) -> u64) -> CniResult<Vec<(FlowKey, u64)>> {
    let Some(map) = open::<FlowKey, V>(pins, name)? else { return Ok(Vec::new()) };
    Ok(map.iter().filter_map(Result::ok).map(|(key, entry)| (key, owner(&entry))).collect())
}

/// Removes the keys of `keys` whose owner `stale` picks; returns how many went.
fn remove_keys<V: Pod>(
    pins: &Pins,
    name: &str,
    keys: &[(FlowKey, u64)],
    stale: impl Fn(&u64) -> bool,
) -> CniResult<usize> {
    let Some(mut map) = open::<FlowKey, V>(pins, name)? else { return Ok(0) };
    // An entry the LRU evicted meanwhile is already gone: not an error.
    Ok(keys.iter().filter(|(_, owner)| stale(owner)).filter(|(key, _)| map.remove(key).is_ok()).count())
}

/// The pinned hash map `name`, if pinned.
fn open<K: Pod, V: Pod>(pins: &Pins, name: &str) -> CniResult<Option<HashMap<MapData, K, V>>> {
    let path = pins.map(name);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
    let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
    HashMap::try_from(map).map(Some).cni(ErrorCode::DATAPATH, format!("pinned {name} has another layout"))
}
