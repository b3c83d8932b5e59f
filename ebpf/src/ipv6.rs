//! IPv6 from a pod (`from_pod`'s other half), in a network with IPv6 addresses (in others it
//! is `UnsupportedProtocol`, as before):
//!
//! 1. The source must be one of the pod's addresses: its global ones, or its link-local one
//!    (an `ENDPOINT_LINK_LOCAL` entry) for link-scope traffic. The unspecified address `::` is
//!    allowed only towards link-scope multicast (MLD reports sent before the pod has a
//!    link-local address).
//! 2. Neighbour solicitations are answered (`ndp.rs`); advertisements must speak for the pod.
//! 3. Link-local and multicast destinations stay on the link: the host veth's stack gets them.
//! 4. To another pod of this node: `bpf_redirect_peer`, unless the stack delivered either pod a
//!    flow from a cluster address (a Service's DNAT, whose replies conntrack must see: the
//!    IPv6 side has no per-flow `FLOWS` entries yet, so such pods' IPv6 goes through the stack).
//! 5. Anything else (the node, other nodes, Services, the outside) goes to the node's stack.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ENDPOINT_LINK_LOCAL, ForwardPath, IpKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{config, deliver, maps, ndp, packet};

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
    let own = match maps::endpoint(&IpKey::v6(src)) {
        Some(own) if own.host_ifindex == packet::ingress_ifindex(ctx) => own,
        _ => return maps::drop(ctx, DropReason::SpoofedSource),
    };
    if next_header == ndp::PROTO_ICMPV6 {
        match ndp::icmp_type(ctx) {
            Some(t) if ndp::is_solicitation(t) => return ndp::solicitation(ctx, &own),
            Some(t) if ndp::is_advertisement(t) && !ndp::advertisement_is_own(ctx, &own) => {
                return maps::drop(ctx, DropReason::SpoofedNeighbor);
            }
            _ => {}
        }
    }
    if is_link_scope(&dst) {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    // A link-local source is no source beyond the link.
    if own.flags & ENDPOINT_LINK_LOCAL != 0 {
        return maps::drop(ctx, DropReason::SpoofedSource);
    }
    match maps::endpoint(&IpKey::v6(dst)) {
        Some(peer) if peer.flags & ENDPOINT_LINK_LOCAL == 0 => {
            if own.stack_replies | peer.stack_replies != 0 {
                return maps::forwarded(ctx, ForwardPath::StackFlow, packet::PASS);
            }
            deliver::into_pod(ctx, &peer, ForwardPath::PodToPod)
        }
        _ => maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS),
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
