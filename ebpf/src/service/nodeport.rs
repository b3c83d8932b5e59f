//! `svc_from_uplink`, before `from_uplink` on the uplink's ingress: Services reached from the
//! LAN (NodePort on the node's address, LoadBalancer ingress IPs, externalIPs), translated per
//! packet with our own state (`ct.rs`).
//!
//! 0. What the packet addresses is decided first, with one lookup (`frontend::addressed`): a
//!    packet to no external frontend, and not to the node's address on a SNAT port, goes on at
//!    once, and one to this node's pods (other nodes' pods' traffic) without any lookup.
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
//! 5. An ICMP error quoting a packet of a tracked flow is translated for the other side
//!    (`icmp_error.rs`).
//!
//! Everything else passes on to `from_uplink` (`TC_ACT_UNSPEC`), untouched.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, IpKey, SVC_CT_CLOSING, SVC_CT_FORWARD, ipv4_in_16};

use super::{
    ct,
    frontend::{self, Addressed},
    icmp_error, lan_affinity,
    maps::REJECT_V4,
    open::{Opened, open},
    reject, xlate,
};
use crate::{
    config,
    flow::{self, Flow, PROTO_TCP, PROTO_UDP},
    maps, packet, policy,
};

pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv4(ctx) || !super::for_this_host(ctx) {
        return packet::PASS;
    }
    // This node's pods' addresses are no frontend and no SNAT address: other nodes' pods'
    // traffic to them (most of what arrives) goes on at once, its ports not even read.
    let Ok((_, dst)) = flow::addresses(ctx) else { return packet::PASS };
    if config::get().in_node_pods(dst) {
        return packet::PASS;
    }
    // The work is in BPF functions of their own, each parsing the packet again rather than
    // holding it in this frame: a call's stack adds to its caller's, 512 bytes in all, and
    // `svc_reject`'s tail call has to be made from here (a BPF function's callers may hold at
    // most 256 bytes for one).
    // An isolated local backend's packet comes back translated, to be delivered from here.
    let verdict = match classify(ctx) {
        Class::Pass => packet::PASS,
        // Without ports: an ICMP error may be about a translated flow (`icmp_error.rs`).
        Class::Unparsed => icmp_error::from_lan(ctx),
        Class::Service => {
            if let Some(verdict) = tracked(ctx) {
                return policy::after_translation(ctx, verdict);
            }
            match new_flow(ctx) {
                // Its first packet goes the way of every later one.
                OPENED => tracked(ctx).unwrap_or(packet::PASS),
                REJECT => reject::tail(ctx, REJECT_V4),
                verdict => verdict,
            }
        }
    };
    policy::after_translation(ctx, verdict)
}

enum Class {
    /// Not a Service's: left to `from_uplink`.
    Pass,
    /// No TCP or UDP ports to read.
    Unparsed,
    /// To an external frontend, or to the node's address on a SNAT port.
    Service,
}

#[inline(never)]
fn classify(ctx: &TcContext) -> Class {
    let Ok(flow) = Flow::parse(ctx) else { return Class::Unparsed };
    // Fragmented datagrams are the stack's (a later fragment has no ports to find a flow by).
    if flow.protocol != PROTO_TCP && flow.protocol != PROTO_UDP || flow.first_fragment {
        return Class::Pass;
    }
    let config = config::get();
    if !lan_source(config, flow.src) {
        return Class::Pass;
    }
    match frontend::addressed(&flow.key(), &ipv4_in_16(config.node_ipv4)) {
        Addressed::Neither => Class::Pass,
        Addressed::Frontend | Addressed::SnatReply => Class::Service,
    }
}

/// A packet of a tracked flow, translated as its entry says; `None` when no entry holds it
/// (or a SYN reuses the client's port of a flow that closed: that opens a new one).
#[inline(never)]
fn tracked(ctx: &TcContext) -> Option<i32> {
    let flow = Flow::parse(ctx).ok()?;
    let key = flow.key();
    let entry = ct::find(&key)?;
    if entry.direction == SVC_CT_FORWARD && entry.state == SVC_CT_CLOSING && flow.opens() {
        return None;
    }
    ct::seen(&key, &entry, flow.tcp_flags, lan_affinity::established);
    Some(xlate::forward(ctx, &flow, &entry))
}

/// `new_flow`'s verdicts beside a TC action: the flow is open (its entries written), or its
/// frontend has no endpoint (answered by `svc_reject`).
const OPENED: i32 = i32::MIN + 1;
const REJECT: i32 = i32::MIN;

/// A packet that may open a flow (rare beside a flow's packets): its frontend, and the flow
/// opened; translating is `tracked`'s, whose frame and this one's would not fit together. To no
/// frontend (a SNAT port's packet of no flow): passed on.
#[inline(never)]
fn new_flow(ctx: &TcContext) -> i32 {
    let Ok(flow) = Flow::parse(ctx) else { return packet::PASS };
    let key = flow.key();
    let node = ipv4_in_16(config::get().node_ipv4);
    let Some(service) = frontend::external(&key, &node) else { return packet::PASS };
    match open(&key, flow.opens(), &service, node) {
        Opened::Flow => OPENED,
        Opened::Pass => packet::PASS,
        Opened::Drop(reason) => maps::drop(ctx, reason),
        Opened::Reject => REJECT,
    }
}

/// Whether `src` may be a peer on the LAN. A source of this node's pods (its subnet, a local
/// endpoint) is forged here: `from_uplink` drops it. The endpoint lookup only for cluster
/// sources, as there. Nor is a peer the node itself, "this network" (0/8), multicast,
/// broadcast or class E: a backend must never take a packet from the LAN for one of the node's
/// own.
#[inline(always)]
pub fn lan_source(config: &DatapathConfig, src: [u8; 4]) -> bool {
    !(config.in_node_pods(src)
        || src == config.node_ipv4
        || src[0] == 0
        || src[0] >= 224
        || config.in_cluster(src) && maps::ENDPOINTS.get_ptr(&IpKey::v4(src)).is_some())
}
