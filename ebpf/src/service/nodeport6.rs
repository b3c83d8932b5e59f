//! `svc_from_uplink6`: `nodeport.rs` for IPv6, before `from_uplink6`, in the same shape. Only
//! packets whose first header after IPv6 is TCP or UDP (`Flow6`); link-scope sources and this
//! node's pods' are left to `from_uplink6`. An ICMPv6 error (no ports) about a tracked flow is
//! translated for the other side (`icmp_error6.rs`).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, IpKey, SVC_CT_CLOSING, SVC_CT_FORWARD};

use super::{
    ct,
    frontend::{self, Addressed},
    icmp_error6, lan_affinity,
    maps::REJECT_V6,
    open::{Opened, open},
    reject, xlate6,
};
use crate::{
    config,
    flow::is_ipv6,
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{Flow6, IP_OFFSET},
    ipv6, maps, packet, policy,
};

/// Where the destination address is in the IPv6 header.
const DST_IN_HEADER: usize = 24;

pub fn ingress(ctx: &TcContext) -> i32 {
    if !is_ipv6(ctx) || !super::for_this_host(ctx) {
        return packet::PASS;
    }
    // As in `nodeport.rs`: this node's pods' addresses are no frontend and no SNAT address, so
    // other nodes' pods' traffic to them goes on before its extension headers are walked.
    let Ok(dst) = ctx.load::<[u8; 16]>(IP_OFFSET + DST_IN_HEADER) else { return packet::PASS };
    if config::get().in_node_pods6(&dst) {
        return packet::PASS;
    }
    // BPF functions of their own, each parsing again, for the stack (see `nodeport.rs`).
    // An isolated local backend's packet comes back translated, to be delivered from here.
    let verdict = match classify(ctx) {
        Class::Pass => packet::PASS,
        // Without ports: an ICMPv6 error may be about a translated flow (`icmp_error6.rs`).
        Class::Unparsed => icmp_error6::from_lan(ctx),
        Class::Service => {
            if let Some(verdict) = tracked(ctx) {
                return policy::after_translation(ctx, verdict);
            }
            match new_flow(ctx) {
                OPENED => tracked(ctx).unwrap_or(packet::PASS),
                REJECT => reject::tail(ctx, REJECT_V6),
                verdict => verdict,
            }
        }
    };
    policy::after_translation(ctx, verdict)
}

enum Class {
    Pass,
    Unparsed,
    Service,
}

#[inline(never)]
fn classify(ctx: &TcContext) -> Class {
    let Ok(flow) = Flow6::parse(ctx) else { return Class::Unparsed };
    let key = &flow.key;
    if key.protocol != PROTO_TCP && key.protocol != PROTO_UDP {
        return Class::Pass;
    }
    let config = config::get();
    if !lan_source(config, &key.src_addr) {
        return Class::Pass;
    }
    match frontend::addressed(key, &config.node_ipv6) {
        Addressed::Neither => Class::Pass,
        Addressed::Frontend | Addressed::SnatReply => Class::Service,
    }
}

/// A packet of a tracked flow, translated as its entry says (`nodeport.rs`'s `tracked`).
#[inline(never)]
fn tracked(ctx: &TcContext) -> Option<i32> {
    let flow = Flow6::parse(ctx).ok()?;
    let key = &flow.key;
    let entry = ct::find(key)?;
    if entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens() {
        return None;
    }
    ct::seen(key, &entry, flow.tcp_flags, lan_affinity::established);
    Some(xlate6::forward(ctx, &flow, &entry))
}

/// `new_flow`'s verdicts beside a TC action (`nodeport.rs`'s).
const OPENED: i32 = i32::MIN + 1;
const REJECT: i32 = i32::MIN;

/// A packet that may open a flow: its frontend, and the flow opened (`nodeport.rs`'s).
#[inline(never)]
fn new_flow(ctx: &TcContext) -> i32 {
    let Ok(flow) = Flow6::parse(ctx) else { return packet::PASS };
    let key = &flow.key;
    let node = config::get().node_ipv6;
    let Some(service) = frontend::external(key, &node) else { return packet::PASS };
    match open(key, flow.opens(), &service, node) {
        Opened::Flow => OPENED,
        Opened::Pass => packet::PASS,
        Opened::Drop(reason) => maps::drop(ctx, reason),
        Opened::Reject => REJECT,
    }
}

/// Whether `src` may be a peer on the LAN: link-scope sources are no client of a Service; this
/// node's pods' are forged (from_uplink6 drops them); nor the node itself, the unspecified
/// address or multicast (ff00::/8).
#[inline(always)]
pub fn lan_source(config: &DatapathConfig, src: &[u8; 16]) -> bool {
    !(ipv6::is_link_scope(src)
        || *src == config.node_ipv6
        || *src == [0; 16]
        || src[0] == 0xff
        || config.in_node_pods6(src)
        || config.in_cluster6(src) && maps::ENDPOINTS.get_ptr(&IpKey::v6(*src)).is_some())
}
