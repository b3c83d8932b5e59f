//! Masquerade, the way back: a reply to a masqueraded flow gets the pod's address and port back
//! and goes on into the node's stack, whose conntrack saw the pod's side of the flow (before
//! `to_uplink` translated it) and so accepts the reply and routes it into the pod.
use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{DatapathConfig, ForwardPath, IpKey};

use crate::{
    flow::{self, Flow},
    fragments, icmp_error, maps, node_echoes, packet,
    rewrite::{Side, rewrite},
    snat,
};

/// A packet to the node's own address.
#[inline(always)]
pub fn reply(ctx: &TcContext, config: &DatapathConfig) -> i32 {
    // Without ports: a later fragment or an ICMP error may belong to a masqueraded flow; the
    // rest is the node's own traffic, not ours to judge.
    let Ok(flow) = Flow::parse(ctx) else {
        return fragments::ingress(ctx).unwrap_or_else(|| icmp_error::translate(ctx, config));
    };
    // Masquerade never hands out a port outside its range: a packet to any other port is for a
    // socket of the node's, whatever `NAT` holds. (An echo reply's identifier is its port.)
    if !config.is_masq_port(flow.dst_port) {
        return packet::PASS;
    }
    let key = flow.key();
    // The node's own ping's reply, whichever pod's flow has the identifier too.
    if node_echoes::holds(&key) {
        return packet::PASS;
    }
    let Some(entry) = maps::NAT.get_ptr_mut(&key) else { return packet::PASS };
    // SAFETY: an LRU value, valid while this program runs.
    let (addr, port, owner) = unsafe { ((*entry).addr, (*entry).port, (*entry).owner) };
    let pod = flow::v4_from_16(addr);
    // A deleted pod's flow (DEL leaves its entries to age): not for the pod that has its
    // address now.
    if maps::ENDPOINTS.get_ptr(&IpKey::v4(pod)).is_none_or(|e| unsafe { (*e).owner } != owner) {
        return packet::PASS;
    }
    // SAFETY: as above.
    unsafe { snat::touch_from_peer(entry, bpf_ktime_get_ns()) };
    if let Err(reason) = rewrite(ctx, &flow, Side::Destination, pod, port) {
        return maps::drop(ctx, reason);
    }
    if flow.first_fragment {
        fragments::remember(&flow, pod, owner);
    }
    maps::forwarded(ctx, ForwardPath::ReplyToPod, packet::PASS)
}
