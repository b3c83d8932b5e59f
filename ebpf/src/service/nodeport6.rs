//! `svc_from_uplink6`: `nodeport.rs` for IPv6, before `from_uplink6`. Only packets whose first
//! header after IPv6 is TCP or UDP (`Flow6`); link-scope sources and this node's pods' are
//! left to `from_uplink6`. An ICMPv6 error (no ports) about a tracked flow is translated for
//! the other side (`icmp_error6.rs`).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, IpKey, SVC_CT_CLOSING, SVC_CT_FORWARD};

use super::{
    ct, frontend, icmp_error6,
    maps::REJECT_V6,
    open::{Opened, open},
    reject, xlate6,
};
use crate::{
    config,
    flow::is_ipv6,
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::Flow6,
    ipv6, maps, packet,
};

pub fn ingress(ctx: &TcContext) -> i32 {
    if !is_ipv6(ctx) || !super::for_this_host(ctx) {
        return packet::PASS;
    }
    // Without ports: an ICMPv6 error may be about a translated flow (`icmp_error6.rs`).
    let Ok(flow) = Flow6::parse(ctx) else { return icmp_error6::from_lan(ctx) };
    let key = &flow.key;
    if key.protocol != PROTO_TCP && key.protocol != PROTO_UDP {
        return packet::PASS;
    }
    let config = config::get();
    if !lan_source(config, &key.src_addr) {
        return packet::PASS;
    }
    if let Some(entry) = ct::find(key) {
        let reopens = entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens();
        if !reopens {
            ct::seen(key, &entry, flow.tcp_flags);
            return xlate6::forward(ctx, &flow, &entry);
        }
    }
    let Some(service) = frontend::external(key, &config.node_ipv6) else { return packet::PASS };
    match open(key, flow.opens(), &service, config.node_ipv6) {
        Opened::Flow(entry) => xlate6::forward(ctx, &flow, &entry),
        Opened::Pass => packet::PASS,
        Opened::Drop(reason) => maps::drop(ctx, reason),
        Opened::Reject => reject::tail(ctx, REJECT_V6),
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
