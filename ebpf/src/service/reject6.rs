//! `reject.rs` for IPv6: a SYN becomes its RST (74 bytes, by incremental checksum updates as
//! for IPv4), a UDP datagram an ICMPv6 port unreachable quoting its IPv6 and UDP headers (110
//! bytes: only a request at least that long is answered, never a larger reply).
//!
//! ICMPv6's checksum covers a pseudo-header, so the IPv4 trick alone does not hold for a
//! `CHECKSUM_PARTIAL` request (a device sums from offset 54 and writes at 60, the message's
//! unused bytes 6–7): those bytes hold the pseudo-header's sum, which makes the complete
//! checksum valid as it is and makes a device's sum write that same value again.
use aya_ebpf::{helpers::bpf_skb_load_bytes, programs::TcContext};
use ebpf_common::DropReason;

use super::reject::{Built, budget, cut, send_back, tcp_to_rst};
use crate::{flow::PROTO_TCP, maps};

const IP: usize = 14;
const L4: usize = 54;
const RST_LEN: u32 = 74;
const ICMP_LEN: u32 = 110;
const HOP_LIMIT: u8 = 64;
const PROTO_ICMPV6: u8 = 58;

/// `svc_reject6`, reached by a tail call from `svc_from_uplink6` (`reject::tail`).
pub fn program(ctx: &TcContext) -> i32 {
    match ctx.load::<u8>(IP + 6) {
        Ok(protocol) => answer(ctx, protocol),
        Err(_) => maps::drop(ctx, DropReason::Malformed),
    }
}

#[inline(always)]
fn answer(ctx: &TcContext, protocol: u8) -> i32 {
    if !budget() {
        return maps::drop(ctx, DropReason::ServiceRejectLimited);
    }
    let _ = maps::drop(ctx, DropReason::ServiceNoEndpoint);
    let built = if protocol == PROTO_TCP { rst(ctx) } else { port_unreachable(ctx) };
    send_back(ctx, built)
}

#[inline(always)]
fn rst(ctx: &TcContext) -> Built {
    let payload: [u8; 2] = ctx.load(IP + 4)?;
    let payload = u16::from_be_bytes(payload);
    let tcp: [u8; 20] = ctx.load(L4)?;
    let header = usize::from(tcp[12] >> 4) * 4;
    if header < 20 || usize::from(payload) != header {
        return Err(-1);
    }
    tcp_to_rst(ctx, L4, &tcp, payload)?;
    reverse_ip(ctx, 20, PROTO_TCP)?;
    cut(ctx, RST_LEN)
}

#[inline(always)]
fn port_unreachable(ctx: &TcContext) -> Built {
    if ctx.len() < ICMP_LEN {
        return Err(-1);
    }
    let mut msg = [0u8; 56];
    // The quote: the request's IPv6 and UDP headers, loaded straight into place.
    let quote: *mut [u8; 48] = (&mut msg[8..56]).as_mut_ptr().cast();
    // SAFETY: 48 writable bytes of `msg`; a constant length, as the verifier wants.
    let loaded = unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), IP as u32, quote.cast(), 48) };
    if loaded != 0 {
        return Err(loaded);
    }
    // The reply's pseudo-header: the quoted addresses (swapped, which moves no sum).
    let pseudo = fold(add(56 + u32::from(PROTO_ICMPV6), &msg[16..48]));
    msg[0] = 1; // destination unreachable
    msg[1] = 4; // port unreachable
    msg[6..8].copy_from_slice(&pseudo.to_be_bytes());
    let check = !fold(add(u32::from(pseudo), &msg));
    msg[2..4].copy_from_slice(&check.to_be_bytes());
    ctx.store(L4, &msg, 0)?;
    reverse_ip(ctx, 56, PROTO_ICMPV6)?;
    cut(ctx, ICMP_LEN)
}

/// The IPv6 header of a reply: `payload` bytes of `next`, a fresh hop limit, addresses swapped.
#[inline(always)]
fn reverse_ip(ctx: &TcContext, payload: u16, next: u8) -> Built {
    let addrs: [u8; 32] = ctx.load(IP + 8)?;
    let len = payload.to_be_bytes();
    ctx.store(IP + 4, &[len[0], len[1], next, HOP_LIMIT], 0)?;
    let mut swapped = [0u8; 32];
    swapped[0..16].copy_from_slice(&addrs[16..32]);
    swapped[16..32].copy_from_slice(&addrs[0..16]);
    ctx.store(IP + 8, &swapped, 0)
}

#[inline(always)]
fn add(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut i = 0;
    while i + 1 < bytes.len() {
        sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}
