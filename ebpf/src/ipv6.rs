//! IPv6 from a pod (`from_pod`'s other half), in a network with IPv6 addresses (in others it
//! is `UnsupportedProtocol`, as before):
//!
//! 1. The source must be one of the pod's addresses: its global ones, or its link-local one
//!    (an `ENDPOINT_LINK_LOCAL` entry) for link-scope traffic. The unspecified address `::` is
//!    allowed only towards link-scope multicast (MLD reports sent before the pod has a
//!    link-local address).
//! 2. Neighbour solicitations are answered (`ndp.rs`); advertisements must speak for the pod.
//! 3. Link-local and multicast destinations stay on the link: the host veth's stack gets them.
//! 4. To another pod of this node: `bpf_redirect_peer`; to a pod of another node: the FIB, out
//!    of the uplink (`fib.rs`); both unless the stack handled the flow's other direction
//!    (`steer.rs`, as for IPv4), and unless the pod has an egress limit (as for IPv4).
//! 5. Anything else (the node, Services, the outside) goes to the node's stack.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ENDPOINT_EGRESS_SHAPED, ENDPOINT_LINK_LOCAL, ForwardPath, IpKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{
    config, deliver, fib, maps, ndp, packet, policy,
    sender::{self, Sender},
    stack_epoch, steer,
};

pub fn from_pod(ctx: &TcContext) -> i32 {
    // A network without IPv6 addresses: the pods' kernels still send router solicitations and
    // MLD reports from their link-local addresses, which go nowhere.
    if config::get().cluster_prefix6 == 0 {
        return maps::drop(ctx, DropReason::UnsupportedProtocol);
    }
    let Some(ip) = packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    // SAFETY: bounds checked by `header_mut`.
    let (src, dst, next_header, version) = unsafe { ((*ip).src_addr, (*ip).dst_addr, (*ip).next_hdr, (*ip).version()) };
    if version != 6 {
        return maps::drop(ctx, DropReason::Malformed);
    }
    if src == [0; 16] {
        if is_link_multicast(&dst) {
            return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
        }
        return maps::drop(ctx, DropReason::SpoofedSource);
    }
    // ICMPv6 (neighbour discovery needs the whole entry) by `ENDPOINTS`; the rest by the host
    // veth's slot first (`sender.rs`).
    let own = if next_header == ndp::PROTO_ICMPV6 {
        let Some(own) = sender::endpoint_of(packet::ingress_ifindex(ctx), &IpKey::v6_words(src)) else {
            return maps::drop(ctx, DropReason::SpoofedSource);
        };
        // SAFETY (here and below): a hash map value, valid while this program runs.
        let entry = unsafe { &*own };
        match ndp::icmp_type(ctx) {
            Some(t) if ndp::is_solicitation(t) => return ndp::solicitation(ctx, entry),
            Some(t) if ndp::is_advertisement(t) && !ndp::advertisement_is_own(ctx, entry) => {
                return maps::drop(ctx, DropReason::SpoofedNeighbor);
            }
            _ => {}
        }
        unsafe { Sender::of_endpoint(own) }
    } else {
        match sender::v6(ctx, &src) {
            Some(own) => own,
            None => return maps::drop(ctx, DropReason::SpoofedSource),
        }
    };
    if is_link_scope(&dst) {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    // A link-local source is no source beyond the link.
    if own.flags & ENDPOINT_LINK_LOCAL != 0 {
        return maps::drop(ctx, DropReason::SpoofedSource);
    }
    // A pointer, not a copy (as for IPv4).
    let peer =
        maps::ENDPOINTS.get_ptr(&IpKey::v6_words(dst)).filter(|&p| unsafe { (*p).flags } & ENDPOINT_LINK_LOCAL == 0);
    let config = config::get();
    // Not a pod here, not a pod elsewhere: the stack's (the node, Services, the outside, an
    // unassigned address of this node's subnet).
    if peer.is_none() && (config.in_node_pods6(&dst) || !config.in_cluster6(&dst)) {
        policy::note_via_stack(ctx, own.owner);
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    // NetworkPolicy, as for IPv4.
    if !policy::egress_allowed(ctx, &own, peer) {
        return maps::drop(ctx, DropReason::PolicyDenied);
    }
    // As for IPv4 (`from_pod.rs`): only flagged pods' flows are looked up in `FLOWS`.
    let flagged = stack_epoch::live_epoch(own.stack_epoch) || peer.is_some_and(|p| stack_epoch::live(unsafe { &*p }));
    if steer::via_stack6(ctx, flagged, own.owner, true) {
        policy::unvouch();
        return maps::forwarded(ctx, ForwardPath::StackFlow, packet::PASS);
    }
    // As for IPv4: a pod with an egress limit sends through the limit's IFB, then the stack.
    if own.flags & ENDPOINT_EGRESS_SHAPED != 0 {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    match peer {
        Some(peer) => deliver::into_pod(ctx, unsafe { &*peer }, ForwardPath::PodToPod),
        None => match (packet::header_mut::<EthHdr>(ctx, 0), packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN)) {
            (Some(eth), Some(ip)) => fib::forward6(ctx, eth, ip),
            _ => maps::drop(ctx, DropReason::Malformed),
        },
    }
}

/// Link-local unicast (fe80::/10) or any multicast (ff00::/8): nothing to route.
#[inline(always)]
pub fn is_link_scope(addr: &[u8; 16]) -> bool {
    addr[0] == 0xff || addr[0] == 0xfe && addr[1] & 0xc0 == 0x80
}

/// Multicast of link-local scope (ff02::/16): all-nodes, all-routers, MLD, solicited-node.
#[inline(always)]
fn is_link_multicast(addr: &[u8; 16]) -> bool {
    addr[0] == 0xff && addr[1] & 0x0f == 0x02
}
