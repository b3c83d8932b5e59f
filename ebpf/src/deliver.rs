//! Delivery into a pod on this node: the frame gets the pod's MAC as destination and the host
//! veth's as source (what the pod expects from its gateway), then `bpf_redirect_peer` puts it
//! straight into the pod's namespace, without a second pass through the node's stack.
use aya_ebpf::{bindings::TC_ACT_REDIRECT, helpers::bpf_redirect_peer, programs::TcContext};
use ebpf_common::{DropReason, Endpoint, ForwardPath};

use crate::maps;

/// Only valid from a TC ingress hook (the helper's requirement). Counted on `path`.
#[inline(always)]
pub fn into_pod(ctx: &TcContext, pod: &Endpoint, path: ForwardPath) -> i32 {
    let macs = [pod.pod_mac, pod.host_mac];
    if ctx.store(0, &macs, 0).is_err() {
        return maps::drop(ctx, DropReason::Malformed);
    }
    // SAFETY: plain helper call.
    let verdict = unsafe { bpf_redirect_peer(pod.host_ifindex, 0) };
    if verdict != i64::from(TC_ACT_REDIRECT) {
        return maps::drop(ctx, DropReason::RedirectFailed);
    }
    maps::forwarded(ctx, path, TC_ACT_REDIRECT as i32)
}
