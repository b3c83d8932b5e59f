//! Delivery into a pod on this node: the frame gets the pod's MAC as destination and the host
//! veth's as source (what the pod expects from its gateway), then `bpf_redirect_peer` puts it
//! straight into the pod's namespace, without a second pass through the node's stack. A pod
//! with an ingress bandwidth limit gets it through its host veth's egress instead, where the
//! limit's TBF qdisc sits (the peer redirect would skip every qdisc). A pod with an egress limit
//! gets nothing delivered here: the stack delivers it all.
use aya_ebpf::{
    bindings::TC_ACT_REDIRECT,
    helpers::{bpf_redirect, bpf_redirect_peer},
    programs::TcContext,
};
use ebpf_common::{DropReason, ENDPOINT_EGRESS_SHAPED, ENDPOINT_SHAPED, Endpoint, FAST_PATH_MARK, ForwardPath};
use network_types::eth::EthHdr;

use crate::{maps, packet, policy};

/// Only valid from a TC ingress hook (the helper's requirement). Counted on `path`.
#[inline(always)]
pub fn into_pod(ctx: &TcContext, pod: &Endpoint, path: ForwardPath) -> i32 {
    // NetworkPolicy: the pod's ingress, on every path that delivers here (same node, other
    // nodes, per-packet Service translation by way of `policy::after_translation`).
    if pod.flags & ENDPOINT_EGRESS_SHAPED == 0 && !policy::ingress_allowed(ctx, pod.host_ifindex, Some(pod.owner)) {
        return maps::drop(ctx, DropReason::PolicyDenied);
    }
    into_pod_unchecked(ctx, pod, path)
}

/// [`into_pod`] without the NetworkPolicy check: for a pod no policy isolates (the Service
/// programs' deep frames, which have no stack left for the check).
#[inline(always)]
pub fn into_pod_unchecked(ctx: &TcContext, pod: &Endpoint, path: ForwardPath) -> i32 {
    // A pod with an egress limit sends everything through the node's stack (`from_pod.rs`): what
    // it receives goes that way too, unchanged, or conntrack would see only the replies of the
    // flows others open to it (a SYN-ACK first: INVALID, which kube-proxy drops).
    if pod.flags & ENDPOINT_EGRESS_SHAPED != 0 {
        let via_stack =
            if path == ForwardPath::FromOtherNode { ForwardPath::UplinkToStack } else { ForwardPath::StackFlow };
        return maps::forwarded(ctx, via_stack, packet::PASS);
    }
    // Written in place (direct packet access), not copied to the stack and stored with
    // `bpf_skb_store_bytes`: two fewer copies and a helper call per packet.
    let Some(eth) = packet::header_mut::<EthHdr>(ctx, 0) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    // SAFETY: bounds checked by `header_mut`. Copies that do not overlap (a map value into the
    // packet): an assignment compiled to a call of a byte-by-byte `memmove` whose two loops
    // (one per direction: the verifier cannot order a packet and a map value) it walked.
    unsafe {
        core::ptr::copy_nonoverlapping(pod.pod_mac.as_ptr(), (*eth).dst_addr.as_mut_ptr(), 6);
        core::ptr::copy_nonoverlapping(pod.host_mac.as_ptr(), (*eth).src_addr.as_mut_ptr(), 6);
    }
    let verdict = if pod.flags & ENDPOINT_SHAPED != 0 {
        // Marked: `to_pod`, on that egress, must not take it for a packet of the node's stack.
        ctx.set_mark(FAST_PATH_MARK);
        // SAFETY: plain helper call.
        unsafe { bpf_redirect(pod.host_ifindex, 0) }
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_redirect_peer(pod.host_ifindex, 0) }
    };
    if verdict != i64::from(TC_ACT_REDIRECT) {
        return maps::drop(ctx, DropReason::RedirectFailed);
    }
    maps::forwarded(ctx, path, TC_ACT_REDIRECT as i32)
}
