//! Forwarding to another node's pods: a FIB lookup in the node's routing table (the per-node
//! routes, host-gw style), then straight out of the uplink. Anything the FIB does not answer
//! with a next hop through the uplink (local address, no route, forwarding off, too big, another
//! interface) goes to the kernel, which does what it always does (forward, ICMP error, drop).
//! Only the uplink: replies come back through it, where `from_uplink` puts them straight into
//! the pod; through another interface they would meet the node's conntrack having never seen
//! the request, which kube-proxy's `--ctstate INVALID -j DROP` drops.
//!
//! A next hop without a neighbour entry yet is no reason to take the stack: a flow's packet
//! that the stack saw in the middle of a flow it never saw begin (a reply whose request came
//! in on the fast path) is INVALID to conntrack and dropped before the neighbour is ever
//! resolved, and it stays unresolved (over IPv6 the other node learns only this node's
//! link-local address from its solicitation). `bpf_redirect_neigh` queues the packet in the
//! neighbour layer instead, which resolves the next hop and sends it, netfilter untouched.
use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams},
    helpers::{bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh},
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
    let mut params = MaybeUninit::uninit();
    let params = zeroed(&mut params);
    params.family = AF_INET;
    params.l4_protocol = ip.proto;
    params.ifindex = packet::ingress_ifindex(ctx);
    // No length: the kernel then checks the packet itself against the route's MTU, which
    // knows a GSO packet is cut into segments that fit (its full length never does).
    params.__bindgen_anon_1.tot_len = 0;
    params.__bindgen_anon_2.tos = ip.tos;
    params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.src_addr);
    params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.dst_addr);
    let next_hop = lookup(ctx, params);
    if next_hop == NextHop::Stack {
        return to_stack(ctx);
    }
    decrement_ttl(ip);
    redirect(ctx, eth, params, next_hop)
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
    let mut params = MaybeUninit::uninit();
    let params = zeroed(&mut params);
    params.family = AF_INET6;
    params.l4_protocol = ip.next_hdr;
    params.ifindex = packet::ingress_ifindex(ctx);
    params.__bindgen_anon_1.tot_len = 0;
    params.__bindgen_anon_3.ipv6_src = words(&ip.src_addr);
    params.__bindgen_anon_4.ipv6_dst = words(&ip.dst_addr);
    let next_hop = lookup(ctx, params);
    if next_hop == NextHop::Stack {
        return to_stack(ctx);
    }
    ip.hop_limit -= 1;
    redirect(ctx, eth, params, next_hop)
}

/// An all-zero `bpf_fib_lookup` (a valid input), zeroed a word at a time: `mem::zeroed()`
/// compiled to a call of a byte-by-byte `memset`, 64 rounds of a loop that the verifier walked
/// on every path to the lookup (and `from_pod` ran per packet).
#[inline(always)]
fn zeroed(params: &mut MaybeUninit<FibParams>) -> &mut FibParams {
    let words = params.as_mut_ptr().cast::<u32>();
    for i in 0..size_of::<FibParams>() / 4 {
        // SAFETY: within the structure, whose alignment is 4 (it holds u32 fields).
        unsafe { words.add(i).write_volatile(0) };
    }
    // SAFETY: every byte written above; all zeros is a valid value of this plain C struct.
    unsafe { params.assume_init_mut() }
}

/// What the FIB answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NextHop {
    /// Through the uplink, its MAC known (`params.dmac`).
    Known,
    /// Through the uplink, its MAC not resolved yet.
    Unresolved,
    /// Anything else: the kernel's.
    Stack,
}

#[inline(always)]
fn lookup(ctx: &TcContext, params: &mut FibParams) -> NextHop {
    let size = core::mem::size_of::<FibParams>() as i32;
    // SAFETY: `params` is a valid, writable lookup structure of `size` bytes.
    let found = unsafe { bpf_fib_lookup(ctx.skb.skb.cast(), params, size, 0) } as u32;
    if params.ifindex != config::get().uplink_ifindex {
        return NextHop::Stack;
    }
    match found {
        BPF_FIB_LKUP_RET_SUCCESS => NextHop::Known,
        BPF_FIB_LKUP_RET_NO_NEIGH => NextHop::Unresolved,
        _ => NextHop::Stack,
    }
}

/// Out of the uplink to the next hop, marked: `to_uplink` must not take it for a packet of the
/// stack's (see `steer.rs`). An unresolved next hop is left to the neighbour layer, which does
/// its own route lookup (no parameters: this happens once per neighbour, not per packet).
#[inline(always)]
fn redirect(ctx: &TcContext, eth: &mut EthHdr, params: &FibParams, next_hop: NextHop) -> i32 {
    ctx.set_mark(FAST_PATH_MARK);
    let verdict = if next_hop == NextHop::Known {
        eth.dst_addr = params.dmac;
        eth.src_addr = params.smac;
        // SAFETY: plain helper call.
        unsafe { bpf_redirect(params.ifindex, 0) }
    } else {
        // SAFETY: plain helper call; no parameters (null, length 0) is documented.
        unsafe { bpf_redirect_neigh(params.ifindex, core::ptr::null_mut(), 0, 0) }
    };
    maps::forwarded(ctx, ForwardPath::ToOtherNode, verdict as i32)
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
