//! Applies an `SVC_CT` entry to the packet in hand (both sides, checksums fixed incrementally
//! by `rewrite.rs`), and sends a translated packet from the uplink on: into a local backend, or
//! out of the uplink again (a remote backend, a remote backend's reply to its client).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ForwardPath, IpKey, SvcCtEntry};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    deliver, fib,
    flow::{Flow, IP_OFFSET, v4_from_16},
    maps, packet, policy,
    rewrite::{Side, rewrite},
};

#[inline(always)]
pub fn apply(ctx: &TcContext, flow: &Flow, entry: &SvcCtEntry) -> Result<(), DropReason> {
    let (src, dst) = (v4_from_16(entry.src_addr), v4_from_16(entry.dst_addr));
    if src != flow.src || entry.src_port != flow.src_port {
        rewrite(ctx, flow, Side::Source, src, entry.src_port)?;
    }
    if dst != flow.dst || entry.dst_port != flow.dst_port {
        rewrite(ctx, flow, Side::Destination, dst, entry.dst_port)?;
    }
    Ok(())
}

/// Translates a packet that arrived on the uplink and sends it where it now goes.
#[inline(always)]
pub fn forward(ctx: &TcContext, flow: &Flow, entry: &SvcCtEntry) -> i32 {
    if let Err(reason) = apply(ctx, flow, entry) {
        return maps::drop(ctx, reason);
    }
    send(ctx, v4_from_16(entry.dst_addr))
}

/// Sends a translated packet to `dst`: into a local backend, or out of the uplink by the FIB
/// (also an ICMP error about the flow, `icmp_error.rs`). Never to the stack, which would take
/// the node's own source address for a martian.
#[inline(always)]
pub fn send(ctx: &TcContext, dst: [u8; 4]) -> i32 {
    if let Some(pod) = maps::endpoint(&IpKey::v4(dst)) {
        // An isolated backend's check needs more stack than this frame leaves: the program's
        // entry delivers it (`policy::after_translation`).
        if policy::subject::of_veth(pod.host_ifindex, Some(pod.owner)).is_some() {
            return policy::DEFERRED;
        }
        return deliver::into_pod_unchecked(ctx, &pod, ForwardPath::ServiceTranslated);
    }
    let (Some(eth), Some(ip)) = (packet::header_mut::<EthHdr>(ctx, 0), packet::header_mut::<Ipv4Hdr>(ctx, IP_OFFSET))
    else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    maps::forwarded(ctx, ForwardPath::ServiceTranslated, 0);
    fib::forward(ctx, eth, ip)
}
