//! `xlate.rs` for IPv6: applies an `SVC_CT` entry (`rewrite6.rs`, no header checksum) and sends
//! a packet from the uplink on, into a local backend or out of the uplink by the FIB.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ForwardPath, IpKey, SvcCtEntry};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{
    deliver, fib,
    flow6::{Flow6, IP_OFFSET},
    maps, packet, policy,
    rewrite::Side,
    rewrite6::rewrite,
};

#[inline(always)]
pub fn apply(ctx: &TcContext, flow: &Flow6, entry: &SvcCtEntry) -> Result<(), DropReason> {
    let k = &flow.key;
    if entry.src_addr != k.src_addr || entry.src_port != k.src_port {
        rewrite(ctx, flow, Side::Source, &entry.src_addr, entry.src_port)?;
    }
    if entry.dst_addr != k.dst_addr || entry.dst_port != k.dst_port {
        rewrite(ctx, flow, Side::Destination, &entry.dst_addr, entry.dst_port)?;
    }
    Ok(())
}

#[inline(always)]
pub fn forward(ctx: &TcContext, flow: &Flow6, entry: &SvcCtEntry) -> i32 {
    if let Err(reason) = apply(ctx, flow, entry) {
        return maps::drop(ctx, reason);
    }
    send(ctx, &entry.dst_addr)
}

/// Sends a translated packet to `dst`: into a local backend, or out of the uplink by the FIB
/// (also an ICMPv6 error about the flow, `icmp_error6.rs`).
#[inline(always)]
pub fn send(ctx: &TcContext, dst: &[u8; 16]) -> i32 {
    if let Some(pod) = maps::endpoint(&IpKey::v6(*dst)) {
        // An isolated backend's check needs more stack than this frame leaves: the program's
        // entry delivers it (`policy::after_translation`).
        if policy::subject::of_veth(pod.host_ifindex, Some(pod.owner)).is_some() {
            return policy::DEFERRED;
        }
        return deliver::into_pod_unchecked(ctx, &pod, ForwardPath::ServiceTranslated);
    }
    let (Some(eth), Some(ip)) = (packet::header_mut::<EthHdr>(ctx, 0), packet::header_mut::<Ipv6Hdr>(ctx, IP_OFFSET))
    else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    maps::forwarded(ctx, ForwardPath::ServiceTranslated, 0);
    fib::forward6(ctx, eth, ip)
}
