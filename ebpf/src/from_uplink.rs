//! `from_uplink`: TC ingress of the uplink, what other nodes and the outside send this node.
//! Everything here comes from the LAN, where any host may forge any header: nothing here
//! creates flow state (`to_pod` does, once the node's stack has accepted a packet).
//!
//! 0. A source of this node's pods (its pod subnet, a local endpoint's address) is forged:
//!    only the node's own veths carry those (`SpoofedUplinkSource`).
//! 1. To the node's address: a reply to a masqueraded flow is translated back and handed to
//!    the stack (`rev_snat.rs`); anything else is the node's.
//! 2. To a pod of this node from another node's pod: straight into the pod, unless the stack
//!    handled the flow's other direction (`steer.rs`).
//! 3. To a pod from outside the cluster: through the stack (its conntrack sees both ways; once
//!    it has accepted a packet that opens a flow, `to_pod` records it, and the pod's replies
//!    keep its address in `to_uplink`).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ForwardPath, IpKey};

use crate::{config, deliver, flow, maps, packet, rev_snat, stack_epoch, steer};

pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv4(ctx) {
        return packet::PASS;
    }
    let Ok((src, dst)) = flow::addresses(ctx) else { return packet::PASS };
    let config = config::get();
    // The endpoint lookup only for cluster sources, where pod addresses are: replies from the
    // outside (masquerade's, the node's own) pay one prefix test, not a hash lookup.
    if config.in_node_pods(src) || config.in_cluster(src) && maps::ENDPOINTS.get_ptr(&IpKey::v4(src)).is_some() {
        return maps::drop(ctx, DropReason::SpoofedUplinkSource);
    }
    if dst == config.node_ipv4 {
        return rev_snat::reply(ctx, &config);
    }
    // Not one of our pods: the node's (an unassigned address of the pod subnet comes back out
    // of the uplink, where `to_uplink` drops it).
    let Some(pod) = maps::endpoint(&IpKey::v4(dst)) else { return packet::PASS };
    if !config.in_cluster(src) {
        return maps::forwarded(ctx, ForwardPath::UplinkToStack, packet::PASS);
    }
    // Untrusted: a SYN from here forgets nothing (`steer::via_stack`).
    if steer::via_stack(ctx, stack_epoch::live(&pod), pod.owner, false) {
        return maps::forwarded(ctx, ForwardPath::UplinkToStack, packet::PASS);
    }
    deliver::into_pod(ctx, &pod, ForwardPath::FromOtherNode)
}
