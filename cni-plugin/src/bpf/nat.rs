//! The control plane's side of the per-flow maps (`NAT`, `FLOWS`, `POD_FLOWS`): forgetting a
//! pod's flows when it goes, so that a late packet finds no state (and never reaches the next pod
//! given the same address).
//!
//! Programs that check owners (`FEATURE_OWNER_CHECKS`) already ignore a gone pod's entries, and
//! masquerade may take their ports, so DEL removes only its `POD_FLOWS` entry (one key) and
//! leaves its flows to age in the LRU maps: a scan of full `NAT` and `FLOWS` maps costs a third
//! of a second, and DEL holds the node's lock. GC sweeps them after it has let the lock go
//! ([`sweep_flows`]). For programs of a build before them, DEL and GC still purge under the lock.
use std::collections::{BTreeSet, HashMap as Counts};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData},
};
use ebpf_common::{
    FEATURE_EGRESS_SHAPING, FEATURE_OWNER_CHECKS, FlowEntry, FlowKey, NAT_REPLY, NAT_TIMEOUT_ICMP_NS,
    NAT_TIMEOUT_TCP_CLOSING_NS, NAT_TIMEOUT_TCP_NS, NAT_TIMEOUT_UDP_NS, NatEntry, PodFlows, Share, ShareKey, names,
};
use nix::time::{ClockId, clock_gettime};

use super::{datapath::Datapath, pins::Pins, read};
use crate::cni::{CniResult, Context, ErrorCode};

impl Datapath {
    /// Whether the loaded programs ignore entries whose owner no longer holds their address.
    pub fn checks_owners(&self) -> bool {
        has_feature(&self.pins, FEATURE_OWNER_CHECKS)
    }

    /// Whether the loaded programs send an egress-limited pod's packets to the node's shaping.
    pub fn shapes_egress(&self) -> bool {
        has_feature(&self.pins, FEATURE_EGRESS_SHAPING)
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

/// Whether the programs pinned at `pins` were loaded with `feature` (a `FEATURE_*` bit of the
/// `FEATURES` map; builds before it have none: no).
pub(super) fn has_feature(pins: &Pins, feature: u64) -> bool {
    let Ok(data) = MapData::from_pin(pins.map(names::FEATURES)) else { return false };
    let Ok(Ok(array)) = Map::from_map_data(data).map(Array::<_, u64>::try_from) else { return false };
    array.get(&0, 0).is_ok_and(|bits| bits & feature != 0)
}

/// Removes the `NAT` and `FLOWS` entries of owners that hold no endpoint, without the node's
/// lock (GC, after it let the lock go): to programs that check owners such entries are only
/// room taken. An owner is judged against the endpoints read after the scan, so an attachment
/// added meanwhile (its endpoint is written before any flow of it exists) keeps its flows.
/// Returns how many `NAT` and `FLOWS` entries went; nothing when the programs do not check
/// owners (GC purged under the lock) or the network's pins are gone.
pub fn sweep_flows(pins: &Pins) -> CniResult<(usize, usize)> {
    if !has_feature(pins, FEATURE_OWNER_CHECKS) {
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
        remove_keys::<NatEntry>(pins, names::NAT, &nat, |e| e.owner, stale)?,
        remove_keys::<FlowEntry>(pins, names::FLOWS, &flows, |e| e.owner, stale)?,
    ))
}

/// Counts again what each pod holds through masquerade (`NAT_SHARES`, see ebpf-common's
/// `shares.rs`) from the reply entries of `NAT` that are still live (within their idle timeout,
/// their owner still an endpoint), and writes the counts over the programs' running ones: a
/// flow the LRU forgot or that idled out unseen stops counting. Without the node's lock: a new
/// flow counted by the programs meanwhile may be lost, which only makes a bound lenient until
/// the next recount. Returns how many counts it wrote.
pub fn recount_shares(pins: &Pins) -> CniResult<usize> {
    let Some(mut shares) = open::<ShareKey, Share>(pins, names::NAT_SHARES)? else { return Ok(0) };
    let Some(nat) = open::<FlowKey, NatEntry>(pins, names::NAT)? else { return Ok(0) };
    let now = monotonic_now()?;
    let live: BTreeSet<u64> = read::endpoint_entries(pins)
        .cni(ErrorCode::DATAPATH, "cannot read ENDPOINTS")?
        .into_iter()
        .map(|(_, endpoint)| endpoint.owner)
        .collect();
    let mut counts: Counts<ShareKey, u32> = Counts::new();
    for (key, entry) in nat.iter().filter_map(Result::ok) {
        let idle = now.saturating_sub(entry.last_seen_ns);
        if entry.direction != NAT_REPLY || !live.contains(&entry.owner) || idle > timeout(&key, &entry) {
            continue;
        }
        let towards = ShareKey {
            owner: entry.owner,
            family: key.family,
            protocol: key.protocol,
            dst_port: key.src_port,
            pad: 0,
            dst_addr: key.src_addr,
        };
        for share in [ShareKey::total(entry.owner), towards] {
            *counts.entry(share).or_insert(0) += 1;
        }
    }
    let stale: Vec<ShareKey> = shares.keys().filter_map(Result::ok).filter(|k| !counts.contains_key(k)).collect();
    for key in &stale {
        let _ = shares.remove(key);
    }
    for (key, held) in &counts {
        shares.insert(key, Share { held: *held, pad: 0 }, 0).cni(ErrorCode::DATAPATH, "cannot write NAT_SHARES")?;
    }
    Ok(counts.len())
}

/// Now on the programs' clock (`bpf_ktime_get_ns`: CLOCK_MONOTONIC), in nanoseconds.
pub(super) fn monotonic_now() -> CniResult<u64> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).cni(ErrorCode::INTERNAL, "cannot read the clock")?;
    Ok(u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec()).unwrap_or(0))
}

/// How long `entry`'s flow holds its port without a packet (as the programs' port search).
fn timeout(key: &FlowKey, entry: &NatEntry) -> u64 {
    match key.protocol {
        6 if entry.closing != 0 => NAT_TIMEOUT_TCP_CLOSING_NS,
        6 => NAT_TIMEOUT_TCP_NS,
        1 | 58 => NAT_TIMEOUT_ICMP_NS,
        _ => NAT_TIMEOUT_UDP_NS,
    }
}

/// Removes the entries of the pinned flow map `name` whose owner `stale` picks.
fn remove_owned<V: Pod>(
    pins: &Pins,
    name: &str,
    owner: fn(&V) -> u64,
    stale: impl Fn(u64) -> bool,
) -> CniResult<usize> {
    let keys = collect_owned::<V>(pins, name, owner)?;
    remove_keys::<V>(pins, name, &keys, owner, |o| stale(*o))
}

/// Every key of the pinned flow map `name` with its entry's owner.
fn collect_owned<V: Pod>(pins: &Pins, name: &str, owner: fn(&V) -> u64) -> CniResult<Vec<(FlowKey, u64)>> {
    let Some(map) = open::<FlowKey, V>(pins, name)? else { return Ok(Vec::new()) };
    Ok(map.iter().filter_map(Result::ok).map(|(key, entry)| (key, owner(&entry))).collect())
}

/// Removes the keys of `keys` whose owner `stale` picks, each read again just before and left
/// if another owner holds it now: a key collected as a gone pod's may be a live flow's by then
/// (the programs take a gone pod's port for a new flow). (The read and the removal are two calls: a key that changes
/// hands in the microseconds between them is still lost; the scan's seconds no longer count.)
/// Returns how many went.
fn remove_keys<V: Pod>(
    pins: &Pins,
    name: &str,
    keys: &[(FlowKey, u64)],
    owner: fn(&V) -> u64,
    stale: impl Fn(&u64) -> bool,
) -> CniResult<usize> {
    let Some(mut map) = open::<FlowKey, V>(pins, name)? else { return Ok(0) };
    let mut removed = 0;
    for (key, collected) in keys.iter().filter(|(_, o)| stale(o)) {
        let unchanged = map.get(key, 0).is_ok_and(|v| owner(&v) == *collected);
        // An entry the LRU evicted meanwhile is already gone: not an error.
        if unchanged && map.remove(key).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
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
