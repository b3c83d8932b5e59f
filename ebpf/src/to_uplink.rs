//! `to_uplink`: TC egress of the uplink, the node's way out to other nodes and the outside.
//!
//! 1. A packet `from_pod` sent by the FIB redirect (`FAST_PATH_MARK`) goes as it is.
//! 2. A packet to an address of this node's pod subnet that is no pod is dropped (`NotAPod`).
//! 3. A pod's packet to another node that came through the stack (a Service's remote
//!    endpoint, after kube-proxy's DNAT) records its flow, so its replies go back through the
//!    stack too (`steer.rs`).
//! 4. A pod's packet to the outside is masqueraded (`snat.rs`, later fragments `fragments.rs`),
//!    unless it is a reply in a flow opened from outside the cluster towards the pod's own
//!    address (`to_pod` recorded it once the stack accepted the flow's first packet).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, FAST_PATH_MARK, ForwardPath, IpKey, ipv4_in_16};

use crate::{config, flow, fragments, icmp_error, maps, node_echoes, packet, policy, snat, stack_epoch, steer};

/// NetworkPolicy first (`policy/`): the egress of the pod whose packet the stack forwarded here,
/// after its translation; then [`egress`]. Two calls one after the other, not one inside the
/// other: `egress`'s frame is 464 of the 512 bytes of stack a chain of calls may use.
/// The contexts go by value: a reference would be one more stack slot in the entry's frame,
/// which the verifier rounds up to 32 bytes.
pub fn program(ctx: TcContext) -> i32 {
    if policy_denies(TcContext::new(ctx.skb.skb)) {
        return aya_ebpf::bindings::TC_ACT_SHOT as i32;
    }
    egress_of(ctx)
}

#[inline(never)]
fn egress_of(ctx: TcContext) -> i32 {
    egress(&ctx)
}

/// Whether NetworkPolicy drops the packet (counted); a frame of its own, as `egress` has.
#[inline(never)]
fn policy_denies(ctx: TcContext) -> bool {
    let ctx = &ctx;
    // SAFETY: `skb` is the context pointer the kernel passed in.
    // From `from_pod`'s FIB redirect: judged there.
    if unsafe { (*ctx.skb.skb).mark } == FAST_PATH_MARK || policy::forwarded_egress_allowed(ctx) {
        return false;
    }
    maps::drop(ctx, DropReason::PolicyDenied);
    true
}

#[inline(always)]
pub fn egress(ctx: &TcContext) -> i32 {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    // Left set: another network's `to_uplink` on this uplink must see it too (and netfilter,
    // which reuses marks, never does: the redirect skips it).
    if unsafe { (*ctx.skb.skb).mark } == FAST_PATH_MARK {
        return packet::PASS;
    }
    if !flow::is_ipv4(ctx) {
        return packet::PASS;
    }
    let Ok((src, dst)) = flow::addresses(ctx) else { return packet::PASS };
    let config = config::get();
    if config.in_node_pods(dst) {
        return maps::drop(ctx, DropReason::NotAPod);
    }
    if src == config.node_ipv4 && config.masquerade != 0 {
        if let Ok(flow) = flow::Flow::parse(ctx) {
            node_echoes::note(&flow, config.port_min, config.port_max);
        }
        return packet::PASS;
    }
    // Only our pods' packets; never multicast or broadcast.
    if !config.in_cluster(src) || dst[0] >= 224 {
        return packet::PASS;
    }
    let Some(pod) = maps::ENDPOINTS.get_ptr_mut(&IpKey::v4(src)) else { return packet::PASS };
    let flow = match flow::Flow::parse(ctx) {
        Ok(flow) => flow,
        // Inside the cluster nothing is translated: fragments and other protocols go as they are.
        // A marked pod's such packets take the stack both ways: the mark holds while they come.
        Err(_) if config.in_cluster(dst) => {
            // SAFETY: a hash map value, valid while this program runs.
            unsafe { stack_epoch::mark(pod) };
            return packet::PASS;
        }
        Err(DropReason::NatUntranslatable) => {
            // SAFETY: a hash map value, valid while this program runs.
            let owner = unsafe { (*pod).owner };
            // The pod's ICMP error about a flow opened from outside to its own address (a Service
            // flow from another node's `svc_from_uplink`, say): it leaves as that flow's replies do.
            // Only to that flow's peer, from the pod's own address (an attack review's): an
            // error quoting one flow must not carry the pod's address to anyone else.
            let about = |key: &ebpf_common::FlowKey| key.src_addr == ipv4_in_16(src) && key.dst_addr == ipv4_in_16(dst);
            if icmp_error::flow_key(ctx).is_some_and(|key| about(&key) && steer::errs_on_outside_flow(&key, owner)) {
                return maps::forwarded(ctx, ForwardPath::NotMasqueraded, packet::PASS);
            }
            return fragments::egress(ctx, owner);
        }
        Err(reason) => return maps::drop(ctx, reason),
    };
    // SAFETY: a hash map value, valid while this program runs.
    let owner = unsafe { (*pod).owner };
    if config.in_cluster(dst) {
        // Both ways: the replies (`from_uplink` looks them up), and the pod's own later packets,
        // which `from_pod` might send by the FIB (a packet the FIB left to the kernel came this
        // way: its hop limit, its size): conntrack must see them all.
        steer::record_stack(&flow.reply_key(), owner, flow.tcp_flags, true);
        steer::record_stack(&flow.key(), owner, flow.tcp_flags, true);
        // SAFETY: as above.
        unsafe { stack_epoch::mark(pod) };
        return packet::PASS;
    }
    match snat::masquerade(ctx, &config, &flow, owner) {
        Ok(snat::Outcome::Masqueraded) => {}
        Ok(snat::Outcome::OwnAddress) => {
            if flow.first_fragment {
                // Its later fragments keep the pod's address too.
                fragments::remember(&flow, flow.src, owner);
            }
            return maps::forwarded(ctx, ForwardPath::NotMasqueraded, packet::PASS);
        }
        Err(reason) => return maps::drop(ctx, reason),
    }
    if flow.first_fragment {
        fragments::remember(&flow, config.node_ipv4, owner);
    }
    maps::forwarded(ctx, ForwardPath::Masqueraded, packet::PASS)
}
