//! The node's own pings through masquerade's identifiers. Masquerade hands a pod's echo flow an
//! identifier of `masqPortRange`, and the kernel keeps no table a program can look up for ping
//! sockets or raw ICMP sockets (its socket lookup helpers know TCP and UDP only). So the node's
//! echo requests are noted where they leave (`to_uplink`, `to_uplink6`: the node's own address
//! as source, which a pod cannot forge past `from_pod`), keyed like a masqueraded echo's reply
//! entry. While one is live (`NAT_TIMEOUT_ICMP_NS` since the node's last request), a pod's new
//! echo flow never takes its identifier for that destination, and the replies go to the node
//! even when a pod's flow took the identifier first (until the node's ping stops, that flow's
//! replies are the node's: two pings with one identifier cannot be told apart).
use aya_ebpf::{bindings::BPF_ANY, helpers::bpf_ktime_get_ns};
use ebpf_common::{FlowKey, NAT_TIMEOUT_ICMP_NS};

use crate::{
    flow::{Flow, PROTO_ICMP},
    flow6::{Flow6, PROTO_ICMPV6},
    maps,
};

/// Notes the node's echo request `flow` (IPv4) if its identifier is masquerade's to hand out.
#[inline(always)]
pub fn note(flow: &Flow, port_min: u16, port_max: u16) {
    if flow.protocol == PROTO_ICMP && flow.may_open() && (port_min..=port_max).contains(&flow.src_port) {
        insert(&flow.reply_key());
    }
}

/// [`note`] for IPv6.
#[inline(always)]
pub fn note6(flow: &Flow6, port_min: u16, port_max: u16) {
    if flow.key.protocol == PROTO_ICMPV6 && flow.may_open() && (port_min..=port_max).contains(&flow.key.src_port) {
        insert(&flow.reply_key());
    }
}

#[inline(always)]
fn insert(reply: &FlowKey) {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = maps::NODE_ECHOES.insert(reply, &now, u64::from(BPF_ANY));
}

/// Whether the echo reply keyed `key` (or a masquerade port claim for it) is the node's ping's.
#[inline(always)]
pub fn holds(key: &FlowKey) -> bool {
    if key.protocol != PROTO_ICMP && key.protocol != PROTO_ICMPV6 {
        return false;
    }
    // SAFETY: an LRU value, read at once.
    let Some(last) = (unsafe { maps::NODE_ECHOES.get(key).copied() }) else { return false };
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }.saturating_sub(last) <= NAT_TIMEOUT_ICMP_NS
}
