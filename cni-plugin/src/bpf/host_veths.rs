//! `HOST_VETHS`: the pod behind each host veth, in a slot found from the veth's ifindex, where
//! `from_pod` looks for a packet's sender before it hashes the source address into `ENDPOINTS`
//! (ebpf-common's `HostVeth` says what a slot holds and when it is only a shortcut). ADD claims
//! the veth's slot before it writes the pod's endpoints, DEL and GC clear it, and the stack
//! epochs' renewal renews its mark with the endpoints'. Pins loaded by an earlier build have no
//! such map (nor the `FEATURE_HOST_VETHS` bit): all of this is skipped there, and their
//! `from_pod` never asks.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv6Addr},
};

use aya::maps::{Array, Map, MapData};
use ebpf_common::{
    ENDPOINT_LINK_LOCAL, Endpoint, FEATURE_HOST_VETHS, HOST_VETHS_SLOTS, HostVeth, host_veth_slot, names,
};

use super::{datapath::Datapath, nat, pins::Pins};
use crate::cni::{CniResult, Context, ErrorCode};

type Slots = Array<MapData, HostVeth>;

/// The pinned map, when the loaded programs use it.
pub(super) fn open(pins: &Pins) -> CniResult<Option<Slots>> {
    if !nat::has_feature(pins, FEATURE_HOST_VETHS) {
        return Ok(None);
    }
    let data = MapData::from_pin(pins.map(names::HOST_VETHS))
        .cni(ErrorCode::DATAPATH, format!("cannot open pinned {}", names::HOST_VETHS))?;
    let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned HOST_VETHS")?;
    Array::try_from(map).map(Some).cni(ErrorCode::DATAPATH, "pinned HOST_VETHS has another layout")
}

/// The slot value for `endpoint`'s pod with addresses `ips` (the first of each family).
fn slot_for(endpoint: &Endpoint, ips: &[IpAddr]) -> HostVeth {
    let ipv4 = ips.iter().find_map(|ip| match ip {
        IpAddr::V4(v4) => Some(v4.octets()),
        IpAddr::V6(_) => None,
    });
    let ipv6 = ips.iter().find_map(|ip| match ip {
        IpAddr::V6(v6) => Some(v6.octets()),
        IpAddr::V4(_) => None,
    });
    HostVeth {
        ifindex: endpoint.host_ifindex,
        flags: endpoint.flags & !ENDPOINT_LINK_LOCAL,
        owner: endpoint.owner,
        stack_epoch: endpoint.stack_epoch,
        ipv4: ipv4.unwrap_or_default(),
        ipv6: ipv6.unwrap_or(Ipv6Addr::UNSPECIFIED.octets()),
    }
}

/// A free slot: no ifindex, no address.
const FREE: HostVeth = HostVeth { ifindex: 0, flags: 0, owner: 0, stack_epoch: 0, ipv4: [0; 4], ipv6: [0; 16] };

impl Datapath {
    /// Gives the pod's host veth its slot, taking it from whatever veth held it (that pod's
    /// packets then take `ENDPOINTS`). Written before the endpoints, so that no program marks
    /// the pod (`stack_epoch::mark`) before the slot is the pod's. Cleared first: the kernel
    /// copies a value in place, and a program reading the slot meanwhile must never see this
    /// veth's ifindex beside the old pod's address.
    pub(super) fn claim_host_veth(&self, endpoint: &Endpoint, ips: &[IpAddr]) -> CniResult<()> {
        let Some(mut slots) = open(&self.pins)? else { return Ok(()) };
        let index = host_veth_slot(endpoint.host_ifindex);
        slots.set(index, FREE, 0).cni(ErrorCode::DATAPATH, "cannot clear a HOST_VETHS slot")?;
        slots.set(index, slot_for(endpoint, ips), 0).cni(ErrorCode::DATAPATH, "cannot write a HOST_VETHS slot")
    }

    /// Clears the slots of the veths `removed` names (ifindex, owner) that still hold them.
    pub(super) fn release_host_veths(&self, removed: &BTreeSet<(u32, u64)>) -> CniResult<()> {
        if removed.is_empty() {
            return Ok(());
        }
        let Some(mut slots) = open(&self.pins)? else { return Ok(()) };
        for &(ifindex, owner) in removed {
            let index = host_veth_slot(ifindex);
            let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a HOST_VETHS slot")?;
            if held.ifindex == ifindex && held.owner == owner {
                slots.set(index, FREE, 0).cni(ErrorCode::DATAPATH, "cannot clear a HOST_VETHS slot")?;
            }
        }
        super::policy_endpoints::release(&self.pins, removed)
    }

    /// Clears the slot of the attachment's host veth `ifindex` (DEL, by the veth it deletes) if
    /// the attachment still holds it: also when none of its endpoints is left to name the veth
    /// (an ADD killed between the slot and its endpoints), where the slot would otherwise vouch
    /// for its address until GC, on whatever interface gets that ifindex again.
    pub fn release_host_veth(&self, ifindex: u32, owner: u64) -> CniResult<()> {
        self.release_host_veths(&BTreeSet::from([(ifindex, owner)]))
    }

    /// Clears every slot whose owner `stale` picks (GC: a slot whose endpoints went without it,
    /// an ADD that failed between the two). Returns how many.
    pub fn clear_host_veths_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        super::policy_endpoints::clear_where(&self.pins, &stale)?;
        let Some(mut slots) = open(&self.pins)? else { return Ok(0) };
        let mut cleared = 0;
        for index in 0..HOST_VETHS_SLOTS {
            let held = slots.get(&index, 0).cni(ErrorCode::DATAPATH, "cannot read a HOST_VETHS slot")?;
            if held.ifindex != 0 && stale(held.owner) {
                slots.set(index, FREE, 0).cni(ErrorCode::DATAPATH, "cannot clear a HOST_VETHS slot")?;
                cleared += 1;
            }
        }
        Ok(cleared)
    }
}

/// Renews to `mark` the slots of `veths` (ifindex, owner) that still hold them and are below it,
/// as the stack epochs' renewal does the pods' endpoints (`stack_epochs.rs`). Under the node's
/// lock: no ADD or DEL rewrites a slot meanwhile, and the programs only move marks up. Returns
/// how many.
pub(super) fn renew(pins: &Pins, veths: &BTreeSet<(u32, u64)>, mark: u32) -> CniResult<usize> {
    let Some(mut slots) = open(pins)? else { return Ok(0) };
    let mut renewed = 0;
    for &(ifindex, owner) in veths {
        let index = host_veth_slot(ifindex);
        let Ok(mut held) = slots.get(&index, 0) else { continue };
        if held.ifindex != ifindex || held.owner != owner || held.stack_epoch >= mark {
            continue;
        }
        held.stack_epoch = mark;
        if slots.set(index, held, 0).is_ok() {
            renewed += 1;
        }
    }
    Ok(renewed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_the_first_address_of_each_family_and_no_link_local_flag() {
        let endpoint = Endpoint {
            host_ifindex: 4_100,
            flags: ebpf_common::ENDPOINT_SHAPED | ENDPOINT_LINK_LOCAL,
            owner: 7,
            pod_mac: [2, 0, 0, 0, 0, 1],
            host_mac: [2, 0, 0, 0, 0, 2],
            stack_epoch: 0,
        };
        let ips: Vec<IpAddr> = ["fd00::5", "10.1.0.5", "10.1.0.6"].iter().map(|s| s.parse().unwrap()).collect();
        let slot = slot_for(&endpoint, &ips);
        assert_eq!(slot.ipv4, [10, 1, 0, 5]);
        assert_eq!(slot.ipv6, "fd00::5".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(slot.flags, ebpf_common::ENDPOINT_SHAPED);
        assert_eq!((slot.ifindex, slot.owner), (4_100, 7));
        let v6_only = slot_for(&endpoint, &ips[..1]);
        assert_eq!(v6_only.ipv4, [0; 4]);
    }
}
