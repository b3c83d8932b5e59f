//! `POLICY_ENDPOINTS`: each local pod as a NetworkPolicy subject, in its host veth's slot (as
//! in `HOST_VETHS`). The agent writes the slots; DEL and GC clear a gone pod's here, by the veth
//! and the attachment, so that a slot never isolates (or un-isolates) whatever pod gets the veth's
//! slot next. Pins of an earlier build have no such map (nor `FEATURE_POLICY`): nothing to do.
use std::collections::BTreeSet;

use aya::maps::{Array, Map, MapData};
use ebpf_common::{FEATURE_POLICY, HOST_VETHS_SLOTS, PolicyEndpoint, host_veth_slot, names};

use super::{nat, pins::Pins};
use crate::cni::{CniResult, Context, ErrorCode};

type Slots = Array<MapData, PolicyEndpoint>;

/// The pinned map, when the loaded programs enforce policy.
pub(crate) fn open(pins: &Pins) -> CniResult<Option<Slots>> {
    if !nat::has_feature(pins, FEATURE_POLICY) {
        return Ok(None);
    }
    let data = MapData::from_pin(pins.map(names::POLICY_ENDPOINTS))
        .cni(ErrorCode::DATAPATH, format!("cannot open pinned {}", names::POLICY_ENDPOINTS))?;
    let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned POLICY_ENDPOINTS")?;
    Array::try_from(map).map(Some).cni(ErrorCode::DATAPATH, "pinned POLICY_ENDPOINTS has another layout")
}

/// Clears the slots of the veths `removed` names (ifindex, owner) that still hold them.
pub(super) fn release(pins: &Pins, removed: &BTreeSet<(u32, u64)>) -> CniResult<()> {
    if removed.is_empty() {
        return Ok(());
    }
    let Some(mut slots) = open(pins)? else { return Ok(()) };
    for &(ifindex, owner) in removed {
        let index = host_veth_slot(ifindex);
        let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a POLICY_ENDPOINTS slot")?;
        if held.ifindex == ifindex && held.owner == owner {
            slots
                .set(index, PolicyEndpoint::default(), 0)
                .cni(ErrorCode::DATAPATH, "cannot clear a POLICY_ENDPOINTS slot")?;
        }
    }
    Ok(())
}

/// Clears every slot whose owner `stale` picks (GC). Returns how many.
pub(super) fn clear_where(pins: &Pins, stale: &impl Fn(u64) -> bool) -> CniResult<usize> {
    let Some(mut slots) = open(pins)? else { return Ok(0) };
    let mut cleared = 0;
    for index in 0..HOST_VETHS_SLOTS {
        let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a POLICY_ENDPOINTS slot")?;
        if held.ifindex != 0 && stale(held.owner) {
            slots
                .set(index, PolicyEndpoint::default(), 0)
                .cni(ErrorCode::DATAPATH, "cannot clear a POLICY_ENDPOINTS slot")?;
            cleared += 1;
        }
    }
    Ok(cleared)
}
