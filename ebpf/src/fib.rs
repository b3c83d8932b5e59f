//! Forwarding to another node's pods: a FIB lookup in the node's routing table (the per-node
//! routes, host-gw style), then straight out of the uplink. Anything the FIB does not answer
//! with a next hop through the uplink (local address, no route, forwarding off, too big, another
//! interface) goes to the kernel, which does what it always does (forward, ICMP error, drop).
//! Only the uplink: replies come back through it, where `from_uplink` puts them straight into
//! the pod; through another interface they would meet the node's conntrack having never seen
//! the request, which kube-proxy's `--ctstate INVALID -j DROP` drops.
use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams},
    helpers::{bpf_fib_lookup, bpf_redirect},
    programs::TcContext,
};
use ebpf_common::{FAST_PATH_MARK, ForwardPath};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

use crate::{config, maps, packet};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

#[inline(always)]
pub fn forward(ctx: &TcContext, eth: *mut EthHdr, ip: *mut Ipv4Hdr) -> i32 {
    // SAFETY: both headers were bounds-checked by the caller; nothing has moved the data since.
    let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
    // An expiring packet is the kernel's to answer (ICMP time exceeded).
    if ip.ttl <= 1 {
        return to_stack(ctx);
    }
    // SAFETY: an all-zero `bpf_fib_lookup` is a valid input.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    params.family = AF_INET;
    params.l4_protocol = ip.proto;
    params.ifindex = packet::ingress_ifindex(ctx);
    // No length: the kernel then checks the packet itself against the route's MTU, which
    // knows a GSO packet is cut into segments that fit (its full length never does).
    params.__bindgen_anon_1.tot_len = 0;
    params.__bindgen_anon_2.tos = ip.tos;
    params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.src_addr);
    params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.dst_addr);
    if !lookup(ctx, &mut params) {
        return to_stack(ctx);
    }
    decrement_ttl(ip);
    redirect(ctx, eth, &params)
}

/// The same for IPv6 (hop limit for TTL; no header checksum to fix).
#[inline(always)]
pub fn forward6(ctx: &TcContext, eth: *mut EthHdr, ip: *mut Ipv6Hdr) -> i32 {
    // SAFETY: both headers were bounds-checked by the caller; nothing has moved the data since.
    let (eth, ip) = unsafe { (&mut *eth, &mut *ip) };
    if ip.hop_limit <= 1 {
        return to_stack(ctx);
    }
    let words = |a: &[u8; 16]| {
        let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        [w(0), w(4), w(8), w(12)]
    };
    // SAFETY: an all-zero `bpf_fib_lookup` is a valid input.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    params.family = AF_INET6;
    params.l4_protocol = ip.next_hdr;
    params.ifindex = packet::ingress_ifindex(ctx);
    params.__bindgen_anon_1.tot_len = 0;
    params.__bindgen_anon_3.ipv6_src = words(&ip.src_addr);
    params.__bindgen_anon_4.ipv6_dst = words(&ip.dst_addr);
    if !lookup(ctx, &mut params) {
        return to_stack(ctx);
    }
    ip.hop_limit -= 1;
    redirect(ctx, eth, &params)
}

/// Whether the FIB has a next hop with its MAC, through the uplink. Not: no neighbour entry yet
/// (the kernel resolves it; this flow then takes the stack both ways, `to_uplink` records it),
/// or another interface than the uplink.
#[inline(always)]
fn lookup(ctx: &TcContext, params: &mut FibParams) -> bool {
    let size = core::mem::size_of::<FibParams>() as i32;
    // SAFETY: `params` is a valid, writable lookup structure of `size` bytes.
    let found = unsafe { bpf_fib_lookup(ctx.skb.skb.cast(), params, size, 0) } as u32;
    found == BPF_FIB_LKUP_RET_SUCCESS && params.ifindex == config::get().uplink_ifindex
}

/// Out of the uplink to the next hop, marked: `to_uplink` must not take it for a packet of the
/// stack's (see `steer.rs`).
#[inline(always)]
fn redirect(ctx: &TcContext, eth: &mut EthHdr, params: &FibParams) -> i32 {
    eth.dst_addr = params.dmac;
    eth.src_addr = params.smac;
    ctx.set_mark(FAST_PATH_MARK);
    // SAFETY: plain helper call.
    let verdict = unsafe { bpf_redirect(params.ifindex, 0) } as i32;
    maps::forwarded(ctx, ForwardPath::ToOtherNode, verdict)
}

#[inline(always)]
fn to_stack(ctx: &TcContext) -> i32 {
    maps::forwarded(ctx, ForwardPath::ToStack, crate::packet::PASS)
}

/// TTL − 1 with the header checksum fixed incrementally (RFC 1624), as a router does.
#[inline(always)]
fn decrement_ttl(ip: &mut Ipv4Hdr) {
    let check = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
    ip.check = ((check + (check >> 16)) as u16).to_be_bytes();
    ip.ttl -= 1;
}
