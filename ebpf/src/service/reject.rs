//! A frontend without endpoint answers at once, as kube-proxy's REJECT rule does: a TCP SYN
//! gets a RST, a UDP datagram an ICMP port unreachable. Built in place from the request and
//! sent back out of the interface it came in on, never larger than the request (the frame is
//! only ever cut), and at most `SVC_REJECTS_PER_SECOND` per CPU: a forged source gets no more
//! bytes than it sent, and not at line rate. Requests with IPv4 options, a SYN carrying data,
//! or a datagram too short to quote are not answered (`service-reject-limited`).
//!
//! Checksums: the request may be `CHECKSUM_PARTIAL` (offloaded, from a veth), where the device
//! later sums from the L4 header (offset 34) and writes at a fixed offset into it. So the RST
//! is made by incremental updates (`l4_csum_replace` knows the skb's mode), and the ICMP
//! message starts at 34 with a complete checksum: summed again there by a device, it comes to
//! zero, which lands in the message's unused field (zero already).
use aya_ebpf::{
    bindings::{BPF_F_PSEUDO_HDR, TC_ACT_REDIRECT},
    helpers::{bpf_ktime_get_ns, bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use ebpf_common::{DropReason, SVC_REJECTS_PER_SECOND};

use super::maps::{SVC_REJECT_PROGS, SVC_REJECTS};
use crate::{
    flow::{Flow, PROTO_TCP},
    maps, packet,
};

const IP: usize = 14;
const L4: usize = 34;
const RST_LEN: u32 = 54;
const ICMP_LEN: u32 = 70;
const TTL: u8 = 64;

/// Hands the packet to the answering program `slot` of `SVC_REJECT_PROGS` (a tail call, which
/// does not return); dropped if that cannot be done.
#[inline(always)]
pub fn tail(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: jumps into a program the loader put there; returns only if it cannot.
    unsafe { SVC_REJECT_PROGS.tail_call(ctx, slot) };
    maps::drop(ctx, DropReason::ServiceRejectLimited)
}

/// `svc_reject`: the answer to an IPv4 request `svc_from_uplink` found no endpoint for.
pub fn program(ctx: &TcContext) -> i32 {
    match Flow::parse(ctx) {
        Ok(flow) => answer(ctx, &flow),
        Err(reason) => maps::drop(ctx, reason),
    }
}

#[inline(always)]
fn answer(ctx: &TcContext, flow: &Flow) -> i32 {
    if flow.l4 != L4 || !budget() {
        return maps::drop(ctx, DropReason::ServiceRejectLimited);
    }
    // Counted with the request's size; the answer replaces it.
    let _ = maps::drop(ctx, DropReason::ServiceNoEndpoint);
    let built = if flow.protocol == PROTO_TCP { rst(ctx) } else { port_unreachable(ctx) };
    send_back(ctx, built)
}

/// Sends the answer `built` in place of the request back out of the interface the request
/// arrived on (both families'); one that could not be built is dropped and counted.
#[inline(always)]
pub(super) fn send_back(ctx: &TcContext, built: Built) -> i32 {
    if built.is_err() || swap_macs(ctx).is_err() {
        return maps::drop(ctx, DropReason::ServiceRejectLimited);
    }
    // SAFETY: plain helper call; out of the interface the request arrived on.
    let verdict = unsafe { bpf_redirect(packet::ingress_ifindex(ctx), 0) };
    if verdict != i64::from(TC_ACT_REDIRECT) {
        return maps::drop(ctx, DropReason::RedirectFailed);
    }
    TC_ACT_REDIRECT as i32
}

/// This CPU's budget of answers for the current second.
#[inline(always)]
pub(super) fn budget() -> bool {
    let Some(b) = SVC_REJECTS.get_ptr_mut(0) else { return false };
    // SAFETY: a helper any program may call; a per-CPU slot only this CPU touches.
    unsafe {
        let now = bpf_ktime_get_ns();
        if now.wrapping_sub((*b).second_start_ns) >= 1_000_000_000 {
            (*b).second_start_ns = now;
            (*b).sent = 0;
        }
        if (*b).sent >= SVC_REJECTS_PER_SECOND {
            return false;
        }
        (*b).sent += 1;
    }
    true
}

pub(super) type Built = Result<(), i64>;

/// The SYN becomes its RST: ports and addresses swapped (which moves no checksum), sequence 0,
/// acknowledging the SYN, no options, 54 bytes.
#[inline(always)]
fn rst(ctx: &TcContext) -> Built {
    let ip: [u8; 20] = ctx.load(IP)?;
    let tcp: [u8; 20] = ctx.load(L4)?;
    let total = u16::from_be_bytes([ip[2], ip[3]]);
    let header = usize::from(tcp[12] >> 4) * 4;
    if header < 20 || usize::from(total) != 20 + header {
        return Err(-1);
    }
    tcp_to_rst(ctx, L4, &tcp, total - 20)?;
    reverse_ip(ctx, &ip, 40, PROTO_TCP)?;
    cut(ctx, RST_LEN)?;
    Ok(())
}

/// Turns the SYN `tcp` (its first 20 bytes) at `l4`, a segment of `segment` bytes, into its
/// RST in place: ports swapped, sequence 0, acknowledging the SYN, no options; its checksum
/// moved by incremental updates only, so it holds for an offloaded (CHECKSUM_PARTIAL) SYN too.
/// Both families' (`reject6.rs`); the caller rewrites the IP header and cuts the frame.
#[inline(always)]
pub(super) fn tcp_to_rst(ctx: &TcContext, l4: usize, tcp: &[u8; 20], segment: u16) -> Built {
    let csum = l4 + 16;
    let header = usize::from(tcp[12] >> 4) * 4;
    // The options leave the sum (a no-op on a CHECKSUM_PARTIAL skb, where the device sums).
    for i in 0..10usize {
        if 20 + i * 4 >= header {
            break;
        }
        let word: u32 = ctx.load(l4 + 20 + i * 4)?;
        ctx.l4_csum_replace(csum, u64::from(word), 0, 4)?;
    }
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let ack = seq.wrapping_add(1).to_be_bytes();
    let mut head = [0u8; 20];
    head[0..2].copy_from_slice(&tcp[2..4]);
    head[2..4].copy_from_slice(&tcp[0..2]);
    head[8..12].copy_from_slice(&ack);
    head[12] = 0x50; // 20 bytes of header
    head[13] = 0x14; // RST, ACK
    // Every word that changed, into the checksum (the port swap moves no sum): sequence,
    // acknowledgement, offset/flags/window, then the urgent pointer.
    for w in 1..4usize {
        let at = w * 4;
        let old = u32::from_ne_bytes([tcp[at], tcp[at + 1], tcp[at + 2], tcp[at + 3]]);
        let new = u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        ctx.l4_csum_replace(csum, u64::from(old), u64::from(new), 4)?;
    }
    ctx.l4_csum_replace(csum, u64::from(u16::from_ne_bytes([tcp[18], tcp[19]])), 0, 2)?;
    // The pseudo-header's TCP (upper-layer) length; its high half is zero both ways.
    let (old_len, new_len) = (segment.to_be(), 20u16.to_be());
    ctx.l4_csum_replace(csum, u64::from(old_len), u64::from(new_len), u64::from(BPF_F_PSEUDO_HDR) | 2)?;
    ctx.store(l4, &[head[0], head[1], head[2], head[3]], 0)?;
    ctx.store(l4 + 4, &[0u8; 4], 0)?;
    ctx.store(l4 + 8, &ack, 0)?;
    ctx.store(l4 + 12, &[head[12], head[13], 0, 0], 0)?;
    ctx.store(l4 + 18, &[0u8; 2], 0)?;
    Ok(())
}

/// The datagram becomes an ICMP port unreachable quoting its IPv4 header and 8 bytes: 70 bytes,
/// so only a request at least that long is answered.
#[inline(always)]
fn port_unreachable(ctx: &TcContext) -> Built {
    if ctx.len() < ICMP_LEN {
        return Err(-1);
    }
    let ip: [u8; 20] = ctx.load(IP)?;
    let udp: [u8; 8] = ctx.load(L4)?;
    let mut icmp = [0u8; 36];
    icmp[0] = 3; // destination unreachable
    icmp[1] = 3; // port unreachable
    icmp[8..28].copy_from_slice(&ip);
    icmp[28..36].copy_from_slice(&udp);
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum);
    let mut outer = [0u8; 20];
    outer[0] = 0x45;
    outer[2..4].copy_from_slice(&56u16.to_be_bytes());
    outer[6] = 0x40; // don't fragment
    outer[8] = TTL;
    outer[9] = 1; // ICMP
    outer[12..16].copy_from_slice(&ip[16..20]);
    outer[16..20].copy_from_slice(&ip[12..16]);
    let sum = checksum(&outer);
    outer[10..12].copy_from_slice(&sum);
    ctx.store(IP, &outer, 0)?;
    ctx.store(L4, &icmp, 0)?;
    cut(ctx, ICMP_LEN)?;
    Ok(())
}

/// The IPv4 header of a reply: addresses swapped (no checksum change), `total` bytes, a fresh TTL.
#[inline(always)]
fn reverse_ip(ctx: &TcContext, ip: &[u8; 20], total: u16, protocol: u8) -> Built {
    let check = IP + 10;
    let old_len = u16::from_ne_bytes([ip[2], ip[3]]);
    ctx.l3_csum_replace(check, u64::from(old_len), u64::from(total.to_be()), 2)?;
    let old_ttl = u16::from_ne_bytes([ip[8], ip[9]]);
    ctx.l3_csum_replace(check, u64::from(old_ttl), u64::from(u16::from_ne_bytes([TTL, protocol])), 2)?;
    ctx.store(IP + 2, &total.to_be_bytes(), 0)?;
    ctx.store(IP + 8, &[TTL], 0)?;
    let mut addrs = [0u8; 8];
    addrs[0..4].copy_from_slice(&ip[16..20]);
    addrs[4..8].copy_from_slice(&ip[12..16]);
    ctx.store(IP + 12, &addrs, 0)
}

/// Cuts the frame to `len` bytes (the answer is never longer than the request).
#[inline(always)]
pub(super) fn cut(ctx: &TcContext, len: u32) -> Built {
    // SAFETY: the context pointer the kernel passed in.
    let ret = unsafe { bpf_skb_change_tail(ctx.skb.skb, len, 0) };
    if ret == 0 { Ok(()) } else { Err(ret) }
}

#[inline(always)]
pub(super) fn swap_macs(ctx: &TcContext) -> Built {
    let macs: [u8; 12] = ctx.load(0)?;
    let mut swapped = [0u8; 12];
    swapped[0..6].copy_from_slice(&macs[6..12]);
    swapped[6..12].copy_from_slice(&macs[0..6]);
    ctx.store(0, &swapped, 0)
}

/// The Internet checksum of `bytes` (its checksum field zero).
#[inline(always)]
fn checksum<const N: usize>(bytes: &[u8; N]) -> [u8; 2] {
    let mut sum = 0u32;
    let mut i = 0;
    while i + 1 < N {
        sum += u32::from(u16::from_be_bytes([bytes[i], bytes[i + 1]]));
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}
