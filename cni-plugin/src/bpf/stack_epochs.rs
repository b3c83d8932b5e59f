//! Letting a pod that once used a Service back onto the fast path: the programs mark a pod
//! with the stack epoch when the node's stack hands it a flow (`Endpoint::stack_epoch`), and
//! look its packets up in `FLOWS` only while the mark is current. Here the agent (every
//! interval) and GC renew the marks of the pods whose `FLOWS` entries live on, then advance the
//! epoch; a pod whose flows are gone lapses two advances later. Why no live flow is ever missed:
//! ebpf-common's `flows.rs`, `STACK_EPOCH_SLOT`.
use std::{collections::BTreeSet, path::Path};

use aya::maps::{Array, HashMap, Map, MapData};
use ebpf_common::{
    Endpoint, FEATURE_STACK_EPOCHS, FLOW_VIA_STACK, FlowEntry, FlowKey, IpKey, STACK_EPOCH_SLOT, flow_timeout, names,
};

use super::{datapath::Datapath, host_veths, nat, pins::Pins};
use crate::cni::{CniResult, Context, ErrorCode};

/// `BPF_EXIST`: an update that never creates an entry (a pod deleted meanwhile stays deleted).
const ONLY_IF_PRESENT: u64 = 2;

/// What one renewal did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Renewed {
    /// Pod addresses whose mark was renewed.
    pub endpoints: usize,
    /// The epoch after the advance; `None` when it did not advance (programs without epochs,
    /// no pins, or another renewal or a new load came first).
    pub epoch: Option<u32>,
}

/// Renews the marks of the pods of `network` under `root` that still have live `FLOWS` entries
/// of the stack's, then advances the epoch. Reads without the node's lock; takes it only for the
/// writes, which are a few map updates.
pub fn renew_stack_epochs(root: &Path, network: &str) -> CniResult<Renewed> {
    let pins = Pins::current(root, network);
    if !nat::has_feature(&pins, FEATURE_STACK_EPOCHS) {
        return Ok(Renewed::default());
    }
    // The maps themselves, opened once: should the datapath be unloaded and loaded again while
    // this runs, the writes below go to the old maps, which nothing reads any more, and never
    // advance the new epoch past marks this scan did not see.
    let mut slot: Array<_, u32> = Array::try_from(open(&pins, names::STACK_EPOCH)?)
        .cni(ErrorCode::DATAPATH, "pinned STACK_EPOCH has another layout")?;
    let mut endpoints: HashMap<_, IpKey, Endpoint> = HashMap::try_from(open(&pins, names::ENDPOINTS)?)
        .cni(ErrorCode::DATAPATH, "pinned ENDPOINTS has another layout")?;
    // Read before the flows: any flow the scan below misses was marked with this epoch plus one.
    let epoch = read_epoch(&slot)?;
    let owners = owners_with_stack_flows(&pins)?;
    let renewed_mark = epoch + 2;
    let with_flows: Vec<(IpKey, Endpoint)> =
        endpoints.iter().filter_map(Result::ok).filter(|(_, e)| owners.contains(&e.owner)).collect();
    let stale: Vec<(IpKey, u64)> =
        with_flows.iter().filter(|(_, e)| e.stack_epoch < renewed_mark).map(|(key, e)| (*key, e.owner)).collect();
    // Their host veths' `HOST_VETHS` slots, where `from_pod` reads the sender's mark.
    let veths: BTreeSet<(u32, u64)> = with_flows.iter().map(|(_, e)| (e.host_ifindex, e.owner)).collect();

    // Under the lock no ADD or DEL changes an entry; the programs only move marks up.
    let _locked = Datapath::lock(root, network)?;
    // Another renewal (GC beside the agent) advanced first: its scan covered this one's.
    if read_epoch(&slot)? != epoch {
        return Ok(Renewed::default());
    }
    let mut renewed = 0;
    for (key, owner) in &stale {
        let Ok(mut entry) = endpoints.get(key, 0) else { continue };
        if entry.owner != *owner {
            continue;
        }
        entry.stack_epoch = entry.stack_epoch.max(renewed_mark);
        if endpoints.insert(key, entry, ONLY_IF_PRESENT).is_ok() {
            renewed += 1;
        }
    }
    host_veths::renew(&pins, &veths, renewed_mark)?;
    slot.set(STACK_EPOCH_SLOT, epoch + 1, 0).cni(ErrorCode::DATAPATH, "cannot advance STACK_EPOCH")?;
    Ok(Renewed { endpoints: renewed, epoch: Some(epoch + 1) })
}

fn read_epoch(slot: &Array<MapData, u32>) -> CniResult<u32> {
    slot.get(&STACK_EPOCH_SLOT, 0).cni(ErrorCode::DATAPATH, "cannot read STACK_EPOCH")
}

/// The owners of `FLOWS` entries that the programs would still honour as the stack's (the
/// flag, within the protocol's idle timeout, as `steer::has`).
fn owners_with_stack_flows(pins: &Pins) -> CniResult<BTreeSet<u64>> {
    let flows: HashMap<_, FlowKey, FlowEntry> =
        HashMap::try_from(open(pins, names::FLOWS)?).cni(ErrorCode::DATAPATH, "pinned FLOWS has another layout")?;
    let now = nat::monotonic_now()?;
    Ok(flows
        .iter()
        .filter_map(Result::ok)
        .filter(|(key, entry)| {
            entry.flags & FLOW_VIA_STACK != 0
                && now.saturating_sub(entry.last_seen_ns) <= flow_timeout(key.protocol, entry.flags)
        })
        .map(|(_, entry)| entry.owner)
        .collect())
}

fn open(pins: &Pins, name: &str) -> CniResult<Map> {
    let data = MapData::from_pin(pins.map(name)).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
    Map::from_map_data(data).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))
}
