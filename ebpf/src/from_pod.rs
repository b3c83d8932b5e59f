//! `from_pod`: TC ingress of each host-side veth, i.e. every packet a pod sends.
//!
//! 0. Frames shorter than their headers, and IPv4 headers with a bad version or length, are
//!    dropped (`Malformed`); ethertypes other than IPv4, IPv6 and ARP (VLAN tags, LLDP…) too
//!    (`UnsupportedProtocol`).
//! 1. ARP goes to the responder (`arp.rs`), IPv6 to `ipv6.rs`.
//! 2. IPv4 whose source is not the pod's own address is dropped (anti-spoofing, `sender.rs`), and so is
//!    IPv4 to 127.0.0.0/8 (`Loopback`): with kube-proxy's `route_localnet=1` the stack would
//!    deliver it to the node's loopback services.
//! 3. IPv4 to another pod on this node is delivered straight into that pod with
//!    `bpf_redirect_peer` (no second pass through the host stack),
//! 4. and IPv4 to a pod on another node goes straight out of the uplink (`fib.rs`),
//!    both unless the node's stack handled the flow's other direction (`steer.rs`): then the
//!    packet goes through the stack, whose conntrack undoes what it translated; and unless the
//!    pod has an egress limit: its packets go on to the next filter (the limit's IFB), then to
//!    the stack.
//!
//! Between 2 and 3, a pod some NetworkPolicy isolates has its egress checked (`policy/`): for
//! packets to pods only; what goes to the node's stack is checked where the stack forwards it,
//! after its own translation (`to_uplink`, `to_pod`).
//! 5. Anything else IPv4 goes to the node's stack (`packet::PASS`): the node's own addresses,
//!    service addresses that kube-proxy translates, and the outside, which is masqueraded on
//!    the way out of the uplink (`snat.rs`), after the node's own NAT rules had their say.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ENDPOINT_EGRESS_SHAPED, ForwardPath, IpKey};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::{arp, config, deliver, fib, ipv6, maps, packet, policy, sender, stack_epoch, steer};

#[inline(always)]
pub fn handle(ctx: &TcContext) -> i32 {
    let Some(eth) = packet::header_mut::<EthHdr>(ctx, 0) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    // SAFETY: bounds checked by `header_mut`.
    let ether_type = unsafe { (*eth).ether_type };
    // Pods have no VLANs: a tagged frame would carry the tag into the destination pod.
    if packet::vlan_tagged(ctx) {
        return maps::drop(ctx, DropReason::UnsupportedProtocol);
    }
    if ether_type == EtherType::Arp as u16 {
        return arp::handle(ctx, eth);
    }
    if ether_type == EtherType::Ipv6 as u16 {
        return ipv6::from_pod(ctx);
    }
    if ether_type != EtherType::Ipv4 as u16 {
        return maps::drop(ctx, DropReason::UnsupportedProtocol);
    }
    ipv4(ctx, eth)
}

#[inline(always)]
fn ipv4(ctx: &TcContext, eth: *mut EthHdr) -> i32 {
    let Some(ip) = packet::header_mut::<Ipv4Hdr>(ctx, EthHdr::LEN) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    // SAFETY: bounds checked by `header_mut`.
    let (src, dst, version, header_len) = unsafe { ((*ip).src_addr, (*ip).dst_addr, (*ip).version(), (*ip).ihl()) };
    // Not IPv4 inside, or a header shorter than its fixed part: nothing a pod's stack would send.
    if version != 4 || usize::from(header_len) < Ipv4Hdr::LEN {
        return maps::drop(ctx, DropReason::Malformed);
    }
    // Here, not on the to-stack branch below, where the extra branch made LLVM emit code the
    // verifier rejects (a register read before it is written on one path).
    if dst[0] == 127 {
        return maps::drop(ctx, DropReason::Loopback);
    }
    let Some(own) = sender::v4(ctx, src) else {
        return maps::drop(ctx, DropReason::SpoofedSource);
    };
    let config = config::get();
    // A pointer, not a copy: on a miss a copy's fields are undefined, and LLVM may spill them
    // on paths that never use them, which the verifier rejects (an uninitialised register).
    let peer = maps::ENDPOINTS.get_ptr(&IpKey::v4(dst));
    // Not a pod here, not a pod elsewhere (an unassigned address of this node's subnet is left
    // to the stack, and `to_uplink` keeps it in the node): the stack's.
    if peer.is_none() && (config.in_node_pods(dst) || !config.in_cluster(dst)) {
        policy::note_via_stack(ctx, own.owner);
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    if !policy::egress_allowed(ctx, &own, peer) {
        return maps::drop(ctx, DropReason::PolicyDenied);
    }
    // Its own stack flows: its replies to flows the stack delivered, and a SYN that must forget
    // the other direction's old entry (`steer.rs`); the peer's: the other direction of those.
    // SAFETY (here and below): a hash map value, valid while this program runs.
    let flagged = stack_epoch::live_epoch(own.stack_epoch) || peer.is_some_and(|p| stack_epoch::live(unsafe { &*p }));
    if steer::via_stack(ctx, flagged, own.owner, true) {
        policy::unvouch();
        return maps::forwarded(ctx, ForwardPath::StackFlow, packet::PASS);
    }
    // An egress limit: the next filter on this hook feeds the limit's IFB, which a redirect would
    // skip; once shaped, the node's stack forwards the packet (`ENDPOINT_EGRESS_SHAPED`).
    if own.flags & ENDPOINT_EGRESS_SHAPED != 0 {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    match peer {
        Some(peer) => deliver::into_pod(ctx, unsafe { &*peer }, ForwardPath::PodToPod),
        None => fib::forward(ctx, eth, ip),
    }
}
