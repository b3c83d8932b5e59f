//! The node's own sockets, as masquerade must see them: a port a node socket holds (a TCP
//! listener or connection, a bound UDP socket) is never handed to a pod's flow, or the replies
//! of one would be taken for the other's. Default ranges keep them apart already
//! (`masqPortRange` above `ip_local_port_range`); this catches what binds into the range.
use aya_ebpf::{
    bindings::{
        BPF_F_CURRENT_NETNS, bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 as Ipv4Tuple,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 as Ipv6Tuple,
    },
    cty::c_void,
    helpers::{bpf_sk_lookup_udp, bpf_sk_release, bpf_skc_lookup_tcp},
    programs::TcContext,
};

use crate::{
    flow::{Flow, PROTO_TCP, PROTO_UDP},
    flow6::Flow6,
};

/// Whether a socket of the node would receive a reply from the flow's destination to
/// `node_ipv4:port`.
#[inline(always)]
pub fn hold(ctx: &TcContext, flow: &Flow, node_ipv4: [u8; 4], port: u16) -> bool {
    // The IPv4 member alone, all the helper reads (`size`): the whole union zeroed first
    // compiled to a call of a byte-by-byte `memset` (for the 24 bytes never read), whose loop
    // the verifier walked on every path through the port search.
    let mut tuple = Ipv4Tuple {
        saddr: u32::from_ne_bytes(flow.dst),
        daddr: u32::from_ne_bytes(node_ipv4),
        sport: flow.dst_port.to_be(),
        dport: port.to_be(),
    };
    lookup(ctx, flow.protocol, (&raw mut tuple).cast(), core::mem::size_of::<Ipv4Tuple>() as u32)
}

/// The same for an IPv6 flow and `node_ipv6:port`. Not inlined: its tuple would take stack
/// in every caller's frame, once per search.
#[inline(never)]
pub fn hold6(ctx: &TcContext, flow: &Flow6, node_ipv6: &[u8; 16], port: u16) -> bool {
    let words = |a: [u8; 16]| {
        let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        [w(0), w(4), w(8), w(12)]
    };
    // The IPv6 member alone, as for IPv4 (it fills the union).
    let mut tuple = Ipv6Tuple {
        saddr: words(flow.key.dst_addr),
        daddr: words(*node_ipv6),
        sport: flow.key.dst_port.to_be(),
        dport: port.to_be(),
    };
    lookup(ctx, flow.key.protocol, (&raw mut tuple).cast(), core::mem::size_of::<Ipv6Tuple>() as u32)
}

/// `tuple` points at the member of `bpf_sock_tuple` that `size` says: the helpers read that much.
#[inline(always)]
fn lookup(ctx: &TcContext, protocol: u8, tuple: *mut bpf_sock_tuple, size: u32) -> bool {
    let netns = BPF_F_CURRENT_NETNS as u64;
    let skb = ctx.skb.skb.cast();
    // SAFETY: helper calls with a valid tuple of `size` bytes; a socket found is released.
    unsafe {
        let socket = match protocol {
            // `skc`: listeners and request and time-wait sockets too, not only full ones.
            PROTO_TCP => bpf_skc_lookup_tcp(skb, tuple, size, netns, 0),
            PROTO_UDP => bpf_sk_lookup_udp(skb, tuple, size, netns, 0),
            _ => return false,
        };
        if socket.is_null() {
            return false;
        }
        bpf_sk_release(socket.cast::<c_void>());
    }
    true
}
