//! `svc_from_uplink`, before `from_uplink` on the uplink's ingress: Services reached from the
//! LAN (NodePort on the node's address, LoadBalancer ingress IPs, externalIPs), translated per
//! packet with our own state (`ct.rs`).
//!
//! 1. A packet of a tracked flow is translated as its entry says: the client's towards the
//!    backend (into a local pod, or out to another node), a remote backend's reply back to the
//!    client as the frontend.
//! 2. A packet to an external frontend that opens a flow (a TCP SYN without ACK, a UDP
//!    datagram) creates its entries, if its client is within its share (`share.rs`): a local
//!    backend keeps the client's address; a remote one (policy Cluster) sees the node's, from a
//!    port of our own (`snat_port.rs`); `externalTrafficPolicy: Local` only ever local ones.
//! 3. Anything else to a frontend creates nothing and is not translated: a forged ACK, RST or
//!    FIN goes to the node's stack, which has no socket there and answers as for any port.
//! 4. A frontend without endpoint answers at once (`reject.rs`).
//!
//! Everything else passes on to `from_uplink` (`TC_ACT_UNSPEC`), untouched.
use aya_ebpf::programs::TcContext;
use ebpf_common::{
    DatapathConfig, DropReason, FlowKey, IpKey, SERVICE_EXTERNAL_LOCAL, SVC_CT_CLOSING, SVC_CT_FORWARD, Service,
    SvcCtEntry, ipv4_in_16,
};

use super::{ct, frontend, reject, share, snat_port, xlate};
use crate::{
    config,
    flow::{self, Flow, PROTO_TCP, PROTO_UDP},
    maps, packet,
};

pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv4(ctx) {
        return packet::PASS;
    }
    let Ok(flow) = Flow::parse(ctx) else { return packet::PASS };
    // Fragmented datagrams are the stack's (a later fragment has no ports to find a flow by).
    if flow.protocol != PROTO_TCP && flow.protocol != PROTO_UDP || flow.first_fragment {
        return packet::PASS;
    }
    let config = config::get();
    // A source of this node's pods is forged here: `from_uplink` drops it.
    if config.in_node_pods(flow.src) {
        return packet::PASS;
    }
    let key = flow.key();
    if let Some(entry) = ct::find(&key) {
        // A SYN reusing the client's port of a flow that closed opens a new one.
        let reopens = entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens();
        if !reopens {
            ct::seen(&key, &entry, &flow);
            return xlate::forward(ctx, &flow, &entry);
        }
    }
    let Some((_, service)) = frontend::external(&flow, config.node_ipv4) else { return packet::PASS };
    open(ctx, config, &flow, &key, &service)
}

#[inline(always)]
fn open(ctx: &TcContext, config: &DatapathConfig, flow: &Flow, key: &FlowKey, service: &Service) -> i32 {
    if flow.protocol == PROTO_TCP && !flow.opens() {
        return packet::PASS;
    }
    let local_only = service.flags & SERVICE_EXTERNAL_LOCAL != 0;
    if service.count == 0 {
        if local_only {
            return maps::drop(ctx, DropReason::ServiceNoLocalEndpoint);
        }
        return reject::answer(ctx, flow);
    }
    if !share::admit(&IpKey::v4(flow.src)) {
        return maps::drop(ctx, DropReason::ServiceClientShare);
    }
    let Some(backend) = frontend::pick(service) else { return packet::PASS };
    let local = maps::ENDPOINTS.get_ptr(&IpKey::v4(flow::v4_from_16(backend.addr))).is_some();
    if !local && local_only {
        return maps::drop(ctx, DropReason::ServiceNoLocalEndpoint);
    }
    let client = (ipv4_in_16(flow.src), flow.src_port);
    let front = (ipv4_in_16(flow.dst), flow.dst_port);
    let to = (backend.addr, backend.port);
    let src = if local {
        let reply_key = flow::key(flow.protocol, flow::v4_from_16(to.0), to.1, flow.src, flow.src_port);
        if !ct::claim_reply(&reply_key, front, client) {
            // A live flow of this client's address and port already reaches this backend
            // through another frontend.
            return maps::drop(ctx, DropReason::ServicePortsExhausted);
        }
        client
    } else {
        let Some(port) = snat_port::claim(flow.protocol, config.node_ipv4, to, front, client) else {
            return maps::drop(ctx, DropReason::ServicePortsExhausted);
        };
        (ipv4_in_16(config.node_ipv4), port)
    };
    let Some(entry) = ct::open(key, &ct::Translation { src, dst: to }) else {
        ct::release(&ct::other_way(&fallback(src, to), flow.protocol, key.family));
        return maps::drop(ctx, DropReason::ServicePortsExhausted);
    };
    aya_log_ebpf::info!(ctx, "service: new flow from port {} to backend port {}", flow.src_port, to.1);
    xlate::forward(ctx, flow, &entry)
}

/// The forward entry that could not be written, to find its reply entry by.
#[inline(always)]
fn fallback(src: ([u8; 16], u16), dst: ([u8; 16], u16)) -> SvcCtEntry {
    SvcCtEntry {
        src_addr: src.0,
        dst_addr: dst.0,
        src_port: src.1,
        dst_port: dst.1,
        direction: SVC_CT_FORWARD,
        state: 0,
        pad: [0; 2],
        last_seen_ns: 0,
    }
}
