//! Masquerade, the way back (`from_uplink`, TC ingress of the uplink): a reply to a masqueraded
//! flow gets the pod's address and port back and goes straight into the pod, skipping the node's
//! stack. Everything else continues into the node unchanged.
use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{ForwardPath, IpKey};

use crate::{
    config, deliver,
    flow::{self, Flow},
    maps,
    rewrite::{Side, rewrite},
    snat,
};

/// TC ingress of the uplink.
pub fn ingress(ctx: &TcContext) -> i32 {
    let config = config::get();
    if config.masquerade == 0 || !flow::is_ipv4(ctx) {
        return crate::packet::PASS;
    }
    let Ok((_, dst)) = flow::addresses(ctx) else { return crate::packet::PASS };
    if dst != config.node_ipv4 {
        return crate::packet::PASS;
    }
    // Not ours to judge: the node's own traffic (fragments, other protocols) goes on as is.
    let Ok(flow) = Flow::parse(ctx) else { return crate::packet::PASS };
    let Some(entry) = maps::NAT.get_ptr_mut(flow.key()) else { return crate::packet::PASS };
    // SAFETY: an LRU value, valid while this program runs.
    let entry = unsafe {
        snat::touch(entry, bpf_ktime_get_ns());
        *entry
    };
    let pod_addr = flow::v4_from_16(entry.addr);
    if let Err(reason) = rewrite(ctx, &flow, Side::Destination, pod_addr, entry.port) {
        return maps::drop(ctx, reason);
    }
    // A pod deleted meanwhile: the node's stack answers (its route to the pod is gone too).
    let Some(pod) = maps::endpoint(&IpKey::v4(pod_addr)) else { return crate::packet::PASS };
    deliver::into_pod(ctx, &pod, ForwardPath::ReplyToPod)
}
