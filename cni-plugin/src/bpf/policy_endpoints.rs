//! `POLICY_ENDPOINTS`: each local pod as a NetworkPolicy subject, in its host veth's slot (as
//! in `HOST_VETHS`), and `POLICY_ENDPOINTS_BY_IFINDEX` for a pod whose slot another live pod
//! holds (ifindexes equal modulo the slots): the datapath looks there only when the slot holds
//! another ifindex. The agent writes both ([`place`] says which pod goes where); DEL and GC
//! clear a gone pod's entries here, by the veth and the attachment, so that an entry never
//! isolates (or un-isolates) whatever pod gets the veth next, and move a pod left in
//! `POLICY_ENDPOINTS_BY_IFINDEX` into the slot its neighbour freed (the datapath would not look
//! for it there once the slot is empty). Pins of an earlier build have no such maps (nor
//! `FEATURE_POLICY`): nothing to do.
use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{Array, HashMap, Map, MapData, MapError};
use ebpf_common::{FEATURE_POLICY, HOST_VETHS_SLOTS, PolicyEndpoint, host_veth_slot, names};

use super::{nat, pins::Pins};
use crate::cni::{CniResult, Context, ErrorCode};

type Slots = Array<MapData, PolicyEndpoint>;
type ByIfindex = HashMap<MapData, u32, PolicyEndpoint>;

/// Where each local pod's entry goes: the slot of its host veth, or by its ifindex when a pod
/// of lower ifindex has the slot (the earlier veth, as a rule: it stays where it is).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub slots: BTreeMap<u32, PolicyEndpoint>,
    pub by_ifindex: BTreeMap<u32, PolicyEndpoint>,
}

/// Places `entries` (one per local pod, `ifindex` nonzero). The writer writes
/// `by_ifindex` entries before the slots (a pod moved out of a slot is found at once) and removes
/// gone `by_ifindex` entries after.
pub fn place(entries: impl IntoIterator<Item = PolicyEndpoint>) -> Placement {
    let mut sorted: Vec<PolicyEndpoint> = entries.into_iter().filter(|e| e.ifindex != 0).collect();
    sorted.sort_by_key(|e| e.ifindex);
    let mut out = Placement::default();
    for entry in sorted {
        match out.slots.get(&host_veth_slot(entry.ifindex)) {
            None => {
                out.slots.insert(host_veth_slot(entry.ifindex), entry);
            }
            Some(held) if held.ifindex == entry.ifindex => {}
            Some(_) => {
                out.by_ifindex.insert(entry.ifindex, entry);
            }
        }
    }
    out
}

fn open_map(pins: &Pins, name: &str) -> CniResult<Map> {
    let data = MapData::from_pin(pins.map(name)).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
    Map::from_map_data(data).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))
}

/// The pinned slots, when the loaded programs enforce policy.
pub(crate) fn open(pins: &Pins) -> CniResult<Option<Slots>> {
    if !nat::has_feature(pins, FEATURE_POLICY) {
        return Ok(None);
    }
    let map = open_map(pins, names::POLICY_ENDPOINTS)?;
    Array::try_from(map).map(Some).cni(ErrorCode::DATAPATH, "pinned POLICY_ENDPOINTS has another layout")
}

/// The pinned `POLICY_ENDPOINTS_BY_IFINDEX`, when the loaded programs enforce policy.
pub fn open_by_ifindex(pins: &Pins) -> CniResult<Option<ByIfindex>> {
    if !nat::has_feature(pins, FEATURE_POLICY) {
        return Ok(None);
    }
    let map = open_map(pins, names::POLICY_ENDPOINTS_BY_IFINDEX)?;
    HashMap::try_from(map).map(Some).cni(ErrorCode::DATAPATH, "pinned POLICY_ENDPOINTS_BY_IFINDEX has another layout")
}

/// Clears the entries of the veths `removed` names (ifindex, owner) that still hold them.
pub(super) fn release(pins: &Pins, removed: &BTreeSet<(u32, u64)>) -> CniResult<()> {
    if removed.is_empty() {
        return Ok(());
    }
    let Some(mut slots) = open(pins)? else { return Ok(()) };
    let mut by_ifindex = open_by_ifindex(pins)?;
    if let Some(map) = by_ifindex.as_mut() {
        for &(ifindex, owner) in removed {
            if map.get(&ifindex, 0).is_ok_and(|held| held.owner == owner) {
                ignore_missing(map.remove(&ifindex))
                    .cni(ErrorCode::DATAPATH, "cannot clear a POLICY_ENDPOINTS_BY_IFINDEX entry")?;
            }
        }
    }
    let mut freed = BTreeSet::new();
    for &(ifindex, owner) in removed {
        let index = host_veth_slot(ifindex);
        let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a POLICY_ENDPOINTS slot")?;
        if held.ifindex == ifindex && held.owner == owner {
            freed.insert(index);
        }
    }
    free(&mut slots, by_ifindex.as_mut(), &freed)
}

/// Clears every entry whose owner `stale` picks (GC). Returns how many.
pub(super) fn clear_where(pins: &Pins, stale: &impl Fn(u64) -> bool) -> CniResult<usize> {
    let Some(mut slots) = open(pins)? else { return Ok(0) };
    let mut by_ifindex = open_by_ifindex(pins)?;
    let mut cleared = 0;
    if let Some(map) = by_ifindex.as_mut() {
        let gone: Vec<u32> =
            map.iter().filter_map(Result::ok).filter(|(_, held)| stale(held.owner)).map(|(k, _)| k).collect();
        for ifindex in gone {
            ignore_missing(map.remove(&ifindex))
                .cni(ErrorCode::DATAPATH, "cannot clear a POLICY_ENDPOINTS_BY_IFINDEX entry")?;
            cleared += 1;
        }
    }
    let mut freed = BTreeSet::new();
    for index in 0..HOST_VETHS_SLOTS {
        let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a POLICY_ENDPOINTS slot")?;
        if held.ifindex != 0 && stale(held.owner) {
            freed.insert(index);
            cleared += 1;
        }
    }
    free(&mut slots, by_ifindex.as_mut(), &freed)?;
    Ok(cleared)
}

/// Frees the slots `freed`: each goes to the pod (lowest ifindex) that waited for it in
/// `by_ifindex`, or is cleared. The waiting pod is written over the gone one (never an empty
/// slot between, where the datapath would not look for it), then removed from `by_ifindex`.
fn free(slots: &mut Slots, by_ifindex: Option<&mut ByIfindex>, freed: &BTreeSet<u32>) -> CniResult<()> {
    let mut next: BTreeMap<u32, PolicyEndpoint> = BTreeMap::new();
    if let Some(map) = &by_ifindex
        && !freed.is_empty()
    {
        for (ifindex, entry) in map.iter().filter_map(Result::ok) {
            let index = host_veth_slot(ifindex);
            if freed.contains(&index) && next.get(&index).is_none_or(|n| n.ifindex > ifindex) {
                next.insert(index, entry);
            }
        }
    }
    for &index in freed {
        let entry = next.get(&index).copied().unwrap_or_default();
        slots.set(index, entry, 0).cni(ErrorCode::DATAPATH, "cannot write a POLICY_ENDPOINTS slot")?;
    }
    if let Some(map) = by_ifindex {
        for entry in next.values() {
            ignore_missing(map.remove(&entry.ifindex))
                .cni(ErrorCode::DATAPATH, "cannot clear a POLICY_ENDPOINTS_BY_IFINDEX entry")?;
        }
    }
    Ok(())
}

fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ifindex: u32) -> PolicyEndpoint {
        PolicyEndpoint { ifindex, flags: 1, owner: u64::from(ifindex) * 10, ..Default::default() }
    }

    #[test]
    fn the_lowest_ifindex_keeps_a_shared_slot_and_the_others_go_by_ifindex() {
        let shared = HOST_VETHS_SLOTS + 7;
        let placed = place([pod(shared * 2 - 7), pod(7), pod(shared), pod(8), pod(0)]);
        assert_eq!(placed.slots.keys().copied().collect::<Vec<_>>(), [7, 8]);
        assert_eq!(placed.slots[&7].ifindex, 7);
        assert_eq!(placed.by_ifindex.keys().copied().collect::<Vec<_>>(), [shared, shared * 2 - 7]);
        assert_eq!(place([pod(9), pod(9)]).by_ifindex.len(), 0, "one pod listed twice is no collision");
    }
}
