//! `to_pod`: TC egress of each host-side veth, i.e. what the node's stack delivers into a pod
//! (the fast paths put packets into pods with `bpf_redirect_peer`, which skips this hook, or,
//! for a pod with an ingress bandwidth limit, through this hook marked `FAST_PATH_MARK`). A
//! packet from a cluster address got here through the stack, maybe translated (a Service's
//! DNAT): its replies must go back through the stack (`steer.rs`). A packet from outside the
//! cluster that came in through the uplink and opens a flow towards the pod's own address is
//! recorded too (`FLOW_FROM_OUTSIDE`: the pod's replies keep its address). Here, after the
//! node's netfilter has accepted and routed it, and not in `from_uplink`, where any packet from
//! the LAN, with any flags, would do. Nothing is dropped here but what NetworkPolicy denies.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, DropReason, FAST_PATH_MARK, IpKey};

use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{config, flow, flow6::Flow6, maps, ndp, packet, policy, snat, snat6, stack_epoch, steer};

pub fn egress(ctx: &TcContext) -> i32 {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    // A fast-path packet for a shaped pod (`deliver.rs`), on its way to the limit's qdisc: no
    // flow of the stack's. The mark is cleared here, not left for the pod to see.
    if unsafe { (*ctx.skb.skb).mark } == FAST_PATH_MARK {
        ctx.set_mark(0);
        return packet::PASS;
    }
    // NetworkPolicy (`policy/`): the pod's ingress, and the egress of a pod of this node whose
    // packet the stack forwarded here (a Service's local backend, after kube-proxy's DNAT).
    // SAFETY: as above.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if !policy::ingress_allowed(ctx, ifindex, None) || !policy::forwarded_egress_allowed(ctx) {
        return maps::drop(ctx, DropReason::PolicyDenied);
    }
    if flow::is_ipv6(ctx) {
        return ipv6(ctx);
    }
    if !flow::is_ipv4(ctx) {
        return packet::PASS;
    }
    let Ok((src, dst)) = flow::addresses(ctx) else { return packet::PASS };
    // From the node, the outside or a Service address: the pod's replies are not addressed to a
    // pod, so no fast path would take them anyway. Nor replies to other nodes' pods when there
    // is no uplink program (no `ipMasq`): those take the stack both ways regardless.
    let config = config::get();
    if !config.in_cluster(src) {
        if config.masquerade != 0 && from_uplink(ctx, &config) {
            from_outside(ctx, &config, dst);
        }
        return packet::PASS;
    }
    if config.uplink_ifindex == 0 && maps::endpoint(&IpKey::v4(src)).is_none() {
        return packet::PASS;
    }
    let Some(pod) = maps::ENDPOINTS.get_ptr_mut(&IpKey::v4(dst)) else { return packet::PASS };
    // SAFETY: a hash map value, valid while this program runs.
    unsafe {
        if let Ok(flow) = flow::Flow::parse(ctx) {
            steer::record_stack(&flow.reply_key(), (*pod).owner, flow.tcp_flags, false);
        }
        // Also for a packet without ports (SCTP, a later fragment): no entry tells its flow, and
        // a marked pod's such packets all take the stack; the mark holds while they keep coming.
        stack_epoch::mark(pod);
    }
    packet::PASS
}

/// Whether the packet entered the node through the uplink (not from the node itself).
#[inline(always)]
fn from_uplink(ctx: &TcContext, config: &DatapathConfig) -> bool {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    config.uplink_ifindex != 0 && unsafe { (*ctx.skb.skb).ingress_ifindex } == config.uplink_ifindex
}

/// A packet from outside the cluster to pod `dst`, accepted by the node's stack: one that opens
/// a flow is recorded, so that the pod's answer may leave with its own address
/// (`steer::answers_outside`); a RST ends a masqueraded flow's hold on its port until the pod
/// shows it alive (`snat::peer_reset`).
#[inline(always)]
fn from_outside(ctx: &TcContext, config: &DatapathConfig, dst: [u8; 4]) {
    let Ok(flow) = flow::Flow::parse(ctx) else { return };
    if flow.resets() {
        snat::peer_reset(&flow, config);
    } else if flow.may_open()
        && let Some(pod) = maps::ENDPOINTS.get_ptr(&IpKey::v4(dst))
    {
        // SAFETY: a hash map value, valid while this program runs.
        steer::record_from_outside(&flow.reply_key(), unsafe { (*pod).owner }, flow.opens());
    }
}

/// The same for IPv6. Neighbour discovery and MLD (ICMPv6 types 130 and up: `ndp.rs` answers
/// with the gateway's address as source) are no flow.
#[inline(always)]
fn ipv6(ctx: &TcContext) -> i32 {
    let Some(ip) = packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN) else { return packet::PASS };
    // SAFETY: bounds checked by `header_mut`.
    let (src, dst, next_header) = unsafe { ((*ip).src_addr, (*ip).dst_addr, (*ip).next_hdr) };
    let config = config::get();
    if next_header == ndp::PROTO_ICMPV6 && ndp::icmp_type(ctx).is_none_or(|t| t >= 130) {
        return packet::PASS;
    }
    if !config.in_cluster6(&src) {
        if config.masquerades6() && from_uplink(ctx, config) {
            from_outside6(ctx, config, &dst);
        }
        return packet::PASS;
    }
    if config.uplink_ifindex == 0 && maps::endpoint(&IpKey::v6(src)).is_none() {
        return packet::PASS;
    }
    let Some(pod) = maps::ENDPOINTS.get_ptr_mut(&IpKey::v6(dst)) else { return packet::PASS };
    // SAFETY: as for IPv4.
    unsafe {
        if let Ok(flow) = Flow6::parse(ctx) {
            steer::record_stack(&flow.reply_key(), (*pod).owner, flow.tcp_flags, false);
        }
        stack_epoch::mark(pod);
    }
    packet::PASS
}

/// [`from_outside`] for IPv6.
#[inline(always)]
fn from_outside6(ctx: &TcContext, config: &DatapathConfig, dst: &[u8; 16]) {
    let Ok(flow) = Flow6::parse(ctx) else { return };
    if flow.resets() {
        snat6::peer_reset(&flow, config);
    } else if flow.may_open()
        && let Some(pod) = maps::ENDPOINTS.get_ptr(&IpKey::v6(*dst))
    {
        // SAFETY: a hash map value, valid while this program runs.
        steer::record_from_outside(&flow.reply_key(), unsafe { (*pod).owner }, flow.opens());
    }
}
