//! IPv6 on the uplink: `to_uplink6` and `from_uplink6`, programs of their own beside the IPv4
//! ones (each program has the 512-byte stack to itself, and IPv4's masquerade needs nearly all
//! of it), attached only for networks with IPv6 addresses. IPv6 between nodes takes
//! the node's stack both ways (no fast path yet, so no per-flow state); what this adds is
//! masquerade to outside the cluster (`snat6.rs`) and, as for IPv4, flows opened from outside
//! towards a pod's own address, whose replies keep that address.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ENDPOINT_LINK_LOCAL, FLOW_FROM_OUTSIDE, ForwardPath, IpKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{config, flow, flow6::Flow6, icmp_error6, ipv6, maps, packet, snat6, steer};

/// Source and destination of the IPv6 packet in hand, read in place (copies would cost stack).
#[inline(always)]
fn addresses(ctx: &TcContext) -> Option<(&[u8; 16], &[u8; 16])> {
    let ip = packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN)?;
    // SAFETY: bounds checked by `header_mut`; the packet is not changed while these are used.
    unsafe { Some((&(*ip).src_addr, &(*ip).dst_addr)) }
}

/// A pod's address (not its link-local one) on this node: its endpoint's owner. Read in place.
#[inline(always)]
fn pod_owner(addr: &[u8; 16]) -> Option<u64> {
    let endpoint = maps::ENDPOINTS.get_ptr(&IpKey::v6(*addr))?;
    // SAFETY: a hash map value, valid while this program runs.
    let (flags, owner) = unsafe { ((*endpoint).flags, (*endpoint).owner) };
    (flags & ENDPOINT_LINK_LOCAL == 0).then_some(owner)
}

/// `to_uplink6`: what `to_uplink` is for IPv4. Anything but IPv6 is `to_uplink`'s.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv6(ctx) {
        return packet::PASS;
    }
    let config = config::get();
    let Some((src, dst)) = addresses(ctx) else { return packet::PASS };
    if config.in_node_pods6(dst) {
        return maps::drop(ctx, DropReason::NotAPod);
    }
    if !config.in_cluster6(src) || config.in_cluster6(dst) || ipv6::is_link_scope(dst) || !config.masquerades6() {
        return packet::PASS;
    }
    let Some(owner) = pod_owner(src) else { return packet::PASS };
    let flow = match Flow6::parse(ctx) {
        Ok(flow) => flow,
        Err(reason) => return maps::drop(ctx, reason),
    };
    if steer::has(&flow.key, FLOW_FROM_OUTSIDE) {
        return maps::forwarded(ctx, ForwardPath::NotMasqueraded, packet::PASS);
    }
    if let Err(reason) = snat6::masquerade(ctx, config, &flow, owner) {
        return maps::drop(ctx, reason);
    }
    maps::forwarded(ctx, ForwardPath::Masqueraded, packet::PASS)
}

/// `from_uplink6`: what `from_uplink` is for IPv4.
#[inline(always)]
pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv6(ctx) {
        return packet::PASS;
    }
    let config = config::get();
    let Some((src, dst)) = addresses(ctx) else { return packet::PASS };
    if config.masquerades6() && *dst == config.node_ipv6 {
        if icmp_error6::is_error(ctx) {
            return icmp_error6::translate(ctx, config);
        }
        return snat6::reply(ctx, config);
    }
    let Some(owner) = pod_owner(dst) else { return packet::PASS };
    if !config.in_cluster6(src)
        && let Ok(flow) = Flow6::parse(ctx)
    {
        steer::record(&flow.reply_key(), owner, FLOW_FROM_OUTSIDE);
    }
    maps::forwarded(ctx, ForwardPath::UplinkToStack, packet::PASS)
}
