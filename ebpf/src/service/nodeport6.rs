//! `svc_from_uplink6`: `nodeport.rs` for IPv6, before `from_uplink6`. Only packets whose first
//! header after IPv6 is TCP or UDP (`Flow6`); link-scope sources and this node's pods' are
//! left to `from_uplink6`.
use aya_ebpf::programs::TcContext;
use ebpf_common::{IpKey, SVC_CT_CLOSING, SVC_CT_FORWARD};

use super::{
    ct,
    frontend::{self, Addressed},
    lan_affinity,
    maps::REJECT_V6,
    open::{Opened, open},
    reject, xlate6,
};
use crate::{
    config,
    flow::is_ipv6,
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{Flow6, IP_OFFSET},
    ipv6, maps, packet,
};

/// Where the destination address is in the IPv6 header.
const DST_IN_HEADER: usize = 24;

pub fn ingress(ctx: &TcContext) -> i32 {
    if !is_ipv6(ctx) || !super::for_this_host(ctx) {
        return packet::PASS;
    }
    let config = config::get();
    // As in `nodeport.rs`: this node's pods' addresses are no frontend and no SNAT address, so
    // other nodes' pods' traffic to them goes on before its extension headers are walked.
    let Ok(dst) = ctx.load::<[u8; 16]>(IP_OFFSET + DST_IN_HEADER) else { return packet::PASS };
    if config.in_node_pods6(&dst) {
        return packet::PASS;
    }
    let Ok(flow) = Flow6::parse(ctx) else { return packet::PASS };
    let key = &flow.key;
    if key.protocol != PROTO_TCP && key.protocol != PROTO_UDP {
        return packet::PASS;
    }
    // Link-scope sources are no client of a Service; this node's pods' are forged (from_uplink6
    // drops them).
    let src = &key.src_addr;
    // Nor the node itself, the unspecified address or multicast (ff00::/8).
    if ipv6::is_link_scope(src)
        || *src == config.node_ipv6
        || *src == [0; 16]
        || src[0] == 0xff
        || config.in_node_pods6(src)
        || config.in_cluster6(src) && maps::ENDPOINTS.get_ptr(&IpKey::v6(*src)).is_some()
    {
        return packet::PASS;
    }
    let addressed = frontend::addressed(key, &config.node_ipv6);
    if addressed == Addressed::Neither {
        return packet::PASS;
    }
    if let Some(verdict) = tracked(ctx, &flow) {
        return verdict;
    }
    // A new flow (rare beside a flow's packets) looks its frontend up again: a `Service` held
    // across `tracked`'s translation would not fit the 512-byte stack.
    let Some(service) = frontend::external(key, &config.node_ipv6) else { return packet::PASS };
    match open(key, flow.opens(), &service, config.node_ipv6) {
        Opened::Flow(entry) => xlate6::forward(ctx, &flow, &entry),
        Opened::Pass => packet::PASS,
        Opened::Drop(reason) => maps::drop(ctx, reason),
        Opened::Reject => reject::tail(ctx, REJECT_V6),
    }
}

/// A packet of a tracked flow, translated as its entry says (`nodeport.rs`'s `tracked`).
#[inline(always)]
fn tracked(ctx: &TcContext, flow: &Flow6) -> Option<i32> {
    let key = &flow.key;
    let entry = ct::find(key)?;
    if entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens() {
        return None;
    }
    ct::seen(key, &entry, flow.tcp_flags, lan_affinity::established);
    Some(xlate6::forward(ctx, flow, &entry))
}
