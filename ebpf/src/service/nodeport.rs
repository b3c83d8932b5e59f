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
use ebpf_common::{IpKey, SVC_CT_CLOSING, SVC_CT_FORWARD, ipv4_in_16};

use super::{
    ct, frontend, lan_affinity,
    maps::REJECT_V4,
    open::{Opened, open},
    reject, xlate,
};
use crate::{
    config,
    flow::{self, Flow, PROTO_TCP, PROTO_UDP},
    maps, packet,
};

pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv4(ctx) || !super::for_this_host(ctx) {
        return packet::PASS;
    }
    let Ok(flow) = Flow::parse(ctx) else { return packet::PASS };
    // Fragmented datagrams are the stack's (a later fragment has no ports to find a flow by).
    if flow.protocol != PROTO_TCP && flow.protocol != PROTO_UDP || flow.first_fragment {
        return packet::PASS;
    }
    let config = config::get();
    // A source of this node's pods (its subnet, a local endpoint) is forged here:
    // `from_uplink` drops it. The endpoint lookup only for cluster sources, as there.
    // Nor is a client the node itself, "this network" (0/8), multicast, broadcast or class E:
    // a backend must never take a packet from the LAN for one of the node's own.
    if config.in_node_pods(flow.src)
        || flow.src == config.node_ipv4
        || flow.src[0] == 0
        || flow.src[0] >= 224
        || config.in_cluster(flow.src) && maps::ENDPOINTS.get_ptr(&IpKey::v4(flow.src)).is_some()
    {
        return packet::PASS;
    }
    let key = flow.key();
    if let Some(entry) = ct::find(&key) {
        // A SYN reusing the client's port of a flow that closed opens a new one.
        let reopens = entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens();
        if !reopens {
            ct::seen(&key, &entry, flow.tcp_flags, lan_affinity::established);
            return xlate::forward(ctx, &flow, &entry);
        }
    }
    let node = ipv4_in_16(config.node_ipv4);
    let Some(service) = frontend::external(&key, &node) else { return packet::PASS };
    match open(&key, flow.opens(), &service, node) {
        Opened::Flow(entry) => xlate::forward(ctx, &flow, &entry),
        Opened::Pass => packet::PASS,
        Opened::Drop(reason) => maps::drop(ctx, reason),
        Opened::Reject => reject::tail(ctx, REJECT_V4),
    }
}
