//! `svc_to_uplink`, before `to_uplink` on the uplink's egress: a local backend's reply to a flow
//! `svc_from_uplink` translated leaves as the frontend (source → the NodePort, LoadBalancer IP
//! or externalIP the client addressed). Only packets from this node's pods that match a reply
//! entry are touched (and their ICMP errors about such flows: `icmp_error.rs`); anything else
//! (not matching the state) goes on to `to_uplink` as it is.
//! `svc_to_uplink6` (`egress6`) does the same for IPv6.
use aya_ebpf::programs::TcContext;
use ebpf_common::{ForwardPath, SVC_CT_REPLY};

use super::{ct, icmp_error, icmp_error6, lan_affinity, xlate, xlate6};
use crate::{
    config,
    flow::{self, Flow, PROTO_TCP, PROTO_UDP},
    flow6::Flow6,
    maps, packet,
};

pub fn egress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv4(ctx) {
        return packet::PASS;
    }
    let Ok((src, _)) = flow::addresses(ctx) else { return packet::PASS };
    if !config::get().in_node_pods(src) {
        return packet::PASS;
    }
    // Without ports: an ICMP error may be about a translated flow (`icmp_error.rs`).
    let Ok(flow) = Flow::parse(ctx) else { return icmp_error::from_backend(ctx, src) };
    if flow.protocol != PROTO_TCP && flow.protocol != PROTO_UDP {
        return packet::PASS;
    }
    let key = flow.key();
    let Some(entry) = ct::find(&key) else { return packet::PASS };
    if entry.direction != SVC_CT_REPLY {
        return packet::PASS;
    }
    ct::seen(&key, &entry, flow.tcp_flags, lan_affinity::established_call);
    if let Err(reason) = xlate::apply(ctx, &flow, &entry) {
        return maps::drop(ctx, reason);
    }
    // `to_uplink` runs next and leaves a packet with a non-pod source alone.
    maps::forwarded(ctx, ForwardPath::ServiceReply, packet::PASS)
}

/// `svc_to_uplink6`: the same for IPv6, before `to_uplink6`.
pub fn egress6(ctx: &TcContext) -> i32 {
    if !flow::is_ipv6(ctx) {
        return packet::PASS;
    }
    // Without ports: an ICMPv6 error may be about a translated flow (`icmp_error6.rs`).
    let Ok(flow) = Flow6::parse(ctx) else { return icmp_error6::from_backend(ctx) };
    let key = &flow.key;
    if key.protocol != PROTO_TCP && key.protocol != PROTO_UDP || !config::get().in_node_pods6(&key.src_addr) {
        return packet::PASS;
    }
    let Some(entry) = ct::find(key) else { return packet::PASS };
    if entry.direction != SVC_CT_REPLY {
        return packet::PASS;
    }
    ct::seen(key, &entry, flow.tcp_flags, lan_affinity::established_call);
    if let Err(reason) = xlate6::apply(ctx, &flow, &entry) {
        return maps::drop(ctx, reason);
    }
    maps::forwarded(ctx, ForwardPath::ServiceReply, packet::PASS)
}
