//! A packet's 5-tuple as `POLICY_FLOWS` keys it (`FlowKey`, ports in host byte order), read
//! into the scratch value. Unlike NAT's (`flow.rs`), every protocol has one: SCTP's ports sit
//! where TCP's and UDP's do; ICMP echo has its identifier as NAT keys it (request: source
//! port, reply: destination port); anything else, and a later fragment, has ports 0 (rules
//! with ports never allow it).
//!
//! An ICMP error (destination unreachable, fragmentation needed / packet too big, time
//! exceeded, parameter problem) is about a packet it quotes: [`inner`] keys it as that
//! packet's reply, so that the error passes where the flow's replies do (PMTU discovery, port
//! unreachable), and only there.
use aya_ebpf::{helpers::bpf_skb_load_bytes, programs::TcContext};
use ebpf_common::{FAMILY_IPV4, FAMILY_IPV6, POLICY_FLOW_KEY_SUBJECT_RECEIVES, POLICY_FLOW_KEY_SUBJECT_SENDS};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv6Hdr,
};

use super::{scratch, scratch::Scratch};
use crate::flow::{PROTO_ICMP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

const PROTO_SCTP: u8 = 132;
const PROTO_ICMPV6: u8 = 58;
const PROTO_HOP_BY_HOP: u8 = 0;
const FRAGMENT_OFFSET: u16 = 0x1fff;
const IP: usize = EthHdr::LEN;

/// A TCP segment that opens a connection: SYN without ACK.
#[inline(always)]
pub fn opens(s: &Scratch) -> bool {
    s.key.protocol == PROTO_TCP && s.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// A TCP segment of a connection already open: with no cached verdict, it may be a reply.
#[inline(always)]
pub fn mid_stream(s: &Scratch) -> bool {
    s.key.protocol == PROTO_TCP && !opens(s)
}

#[inline(always)]
pub fn closes(s: &Scratch) -> bool {
    s.key.protocol == PROTO_TCP && s.tcp_flags & (TCP_FIN | TCP_RST) != 0
}

/// Marks the key as the check's pod's: it sends the packet (egress) or receives it.
#[inline(always)]
pub fn own(s: &mut Scratch, egress: bool) {
    s.key.pad[0] = if egress { POLICY_FLOW_KEY_SUBJECT_SENDS } else { POLICY_FLOW_KEY_SUBJECT_RECEIVES };
}

/// Turns the key into the other direction's (twice: back); the pod's end turns with it.
#[inline(always)]
pub fn turn(s: &mut Scratch) {
    let k = &mut s.key;
    k.pad[0] ^= POLICY_FLOW_KEY_SUBJECT_SENDS ^ POLICY_FLOW_KEY_SUBJECT_RECEIVES;
    core::mem::swap(&mut k.src_port, &mut k.dst_port);
    // Word by word: a swap of the arrays goes through a 16-byte temporary on the stack.
    let (a, b) = ((&raw mut k.src_addr).cast::<u32>(), (&raw mut k.dst_addr).cast::<u32>());
    // SAFETY: 4-aligned words of the key.
    unsafe {
        for i in 0..4 {
            core::ptr::swap(a.add(i), b.add(i));
        }
    }
}

/// Copies `len` bytes of the packet at `offset` into `to` (scratch memory): straight from
/// the linear data when they are there (most packets: a helper call less), else by
/// `bpf_skb_load_bytes`.
#[inline(always)]
fn load(ctx: &TcContext, offset: usize, to: *mut u8, len: usize) -> bool {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + offset + len <= end {
        // SAFETY: bounds checked just above; `to` points at `len` bytes of the scratch value.
        unsafe { core::ptr::copy_nonoverlapping((start + offset) as *const u8, to, len) };
        return true;
    }
    // SAFETY: as above for `to`.
    unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), offset as u32, to.cast(), len as u32) == 0 }
}

/// Reads the tuple of an IPv4 or IPv6 packet into `s`; false for anything else, a truncated IP
/// header, and ICMPv6 neighbour discovery and MLD, also behind a Hop-by-Hop header
/// ([`link_control`]: never a policy's business, never remembered). An L4 header too short for
/// its ports leaves them 0: rules with ports never allow it.
#[inline(always)]
pub fn parse(ctx: &TcContext, s: &mut Scratch) -> bool {
    if !load(ctx, core::mem::offset_of!(EthHdr, ether_type), s.l4.as_mut_ptr(), 2) {
        return false;
    }
    let ether_type = u16::from_ne_bytes([s.l4[0], s.l4[1]]);
    s.key.pad = [0; 2];
    s.key.src_port = 0;
    s.key.dst_port = 0;
    s.tcp_flags = 0;
    s.icmp_error = 0;
    let ip: *mut u8 = s.ip.as_mut_ptr();
    let l4 = if ether_type == EtherType::Ipv4 as u16 {
        if !load(ctx, IP, ip, 20) {
            return false;
        }
        s.key.family = FAMILY_IPV4;
        s.key.protocol = s.ip[9];
        // SAFETY: words of the scratch value, 4-aligned (`scratch.rs`).
        unsafe {
            let words = ip.cast::<u32>();
            scratch::set_v4(&raw mut s.key.src_addr, *words.add(3));
            scratch::set_v4(&raw mut s.key.dst_addr, *words.add(4));
        }
        let h = &s.ip;
        if u16::from_be_bytes([h[6], h[7]]) & FRAGMENT_OFFSET != 0 {
            return true;
        }
        IP + usize::from(h[0] & 0x0f) * 4
    } else if ether_type == EtherType::Ipv6 as u16 {
        if !load(ctx, IP, ip, 40) {
            return false;
        }
        s.key.family = FAMILY_IPV6;
        s.key.protocol = s.ip[6];
        // SAFETY: both within the scratch value: bytes 8..24 and 24..40 of the header, 4-aligned.
        unsafe {
            scratch::copy16(&raw mut s.key.src_addr, ip.add(8).cast());
            scratch::copy16(&raw mut s.key.dst_addr, ip.add(24).cast());
        }
        IP + Ipv6Hdr::LEN
    } else {
        return false;
    };
    let protocol = s.key.protocol;
    let l4_bytes: *mut u8 = s.l4.as_mut_ptr();
    match protocol {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => {
            let len = if protocol == PROTO_TCP { 14 } else { 4 };
            // Too short for its ports and flags (a first fragment of 8 bytes): judged as a
            // packet without ports, not let through unjudged.
            if !load(ctx, l4, l4_bytes, len) {
                return true;
            }
            let h = &s.l4;
            s.key.src_port = u16::from_be_bytes([h[0], h[1]]);
            s.key.dst_port = u16::from_be_bytes([h[2], h[3]]);
            if protocol == PROTO_TCP {
                s.tcp_flags = h[13] & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK);
            }
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            // Type, code, checksum, identifier.
            if !load(ctx, l4, l4_bytes, 6) {
                return true;
            }
            let h = &s.l4;
            if protocol == PROTO_ICMPV6 && link_control(h[0], s.ip[7]) {
                return false;
            }
            let id = u16::from_be_bytes([h[4], h[5]]);
            match (protocol, h[0]) {
                (PROTO_ICMP, 8) | (PROTO_ICMPV6, 128) => s.key.src_port = id,
                (PROTO_ICMP, 0) | (PROTO_ICMPV6, 129) => s.key.dst_port = id,
                (PROTO_ICMP, 3 | 11 | 12) | (PROTO_ICMPV6, 1..=4) => s.icmp_error = 1,
                _ => {}
            }
        }
        // MLD reports and queries come behind a Hop-by-Hop header (router alert): link
        // control too, when what follows is.
        PROTO_HOP_BY_HOP if s.key.family == FAMILY_IPV6 => {
            if load(ctx, l4, l4_bytes, 2) && s.l4[0] == PROTO_ICMPV6 {
                let after = l4 + (usize::from(s.l4[1]) + 1) * 8;
                // By the helper: the verifier refuses a direct read at an offset the packet gave.
                // SAFETY: `l4_bytes` points at the scratch value's 16 L4 bytes.
                let read = unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), after as u32, l4_bytes.cast(), 1) == 0 };
                if read && link_control(s.l4[0], s.ip[7]) {
                    return false;
                }
            }
        }
        _ => {}
    }
    true
}

/// ICMPv6 neighbour discovery (133–137, hop limit 255) and MLD (130–132, 143, hop limit 1):
/// link-scope control no NetworkPolicy governs (the pod's IPv6 needs them). The hop limits
/// the receivers insist on (RFC 4861, RFC 3810): nothing routed from afar is let through.
#[inline(always)]
fn link_control(icmp_type: u8, hop_limit: u8) -> bool {
    match icmp_type {
        133..=137 => hop_limit == 255,
        130..=132 | 143 => hop_limit == 1,
        _ => false,
    }
}

/// For an ICMP error ([`parse`] said so): keys `s` as the reply of the packet the error quotes
/// (its addresses and ports turned around; the pod's end kept), so that the flow's entry is
/// found. False when the quoted packet is not TCP, UDP or SCTP, or is cut short; `s` is then
/// no packet's key (parse again).
#[inline(always)]
pub fn inner(ctx: &TcContext, s: &mut Scratch) -> bool {
    let outer = if s.key.family == FAMILY_IPV4 { usize::from(s.ip[0] & 0x0f) * 4 } else { Ipv6Hdr::LEN };
    // The ICMP header: type, code, checksum, 4 bytes (unused, MTU, pointer).
    let at = IP + outer + 8;
    let ip: *mut u8 = s.ip.as_mut_ptr();
    let l4 = if s.key.family == FAMILY_IPV4 {
        if !load(ctx, at, ip, 20) {
            return false;
        }
        s.key.protocol = s.ip[9];
        // SAFETY: words of the scratch value, 4-aligned (`scratch.rs`): the quoted source is
        // the reply's destination.
        unsafe {
            let words = ip.cast::<u32>();
            scratch::set_v4(&raw mut s.key.dst_addr, *words.add(3));
            scratch::set_v4(&raw mut s.key.src_addr, *words.add(4));
        }
        if u16::from_be_bytes([s.ip[6], s.ip[7]]) & FRAGMENT_OFFSET != 0 {
            return false;
        }
        at + usize::from(s.ip[0] & 0x0f) * 4
    } else {
        if !load(ctx, at, ip, 40) {
            return false;
        }
        s.key.protocol = s.ip[6];
        // SAFETY: within the scratch value, 4-aligned, as in `parse`.
        unsafe {
            scratch::copy16(&raw mut s.key.dst_addr, ip.add(8).cast());
            scratch::copy16(&raw mut s.key.src_addr, ip.add(24).cast());
        }
        at + Ipv6Hdr::LEN
    };
    if !matches!(s.key.protocol, PROTO_TCP | PROTO_UDP | PROTO_SCTP) || !load(ctx, l4, s.l4.as_mut_ptr(), 4) {
        return false;
    }
    let h = &s.l4;
    s.key.dst_port = u16::from_be_bytes([h[0], h[1]]);
    s.key.src_port = u16::from_be_bytes([h[2], h[3]]);
    s.tcp_flags = 0;
    true
}
