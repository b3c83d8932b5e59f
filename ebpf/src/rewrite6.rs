//! Rewrites one side (address and port) of an IPv6 flow in place (`rewrite.rs` for IPv4).
//! IPv6 has no header checksum; the L4 checksum covers the addresses through the
//! pseudo-header, ICMPv6's too (unlike ICMPv4's), so each translation fixes it.
//!
//! A NIC that reports `CHECKSUM_COMPLETE` gives the sum of the whole packet in `skb->csum`. An
//! IPv6 address change moves that sum, and the L4 checksum's change moves it back: it must stay
//! as it is. For a pseudo-header update the kernel adjusts it as IPv4 needs (there, the header
//! checksum absorbs the address change), unless told `BPF_F_IPV6` (Linux 6.16 and later). On
//! a kernel without that flag the helper refuses it, and the adjustment is undone by hand
//! (`bpf_csum_update`), so either way the stack never takes a translated packet for corrupt.
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::{bpf_csum_diff, bpf_csum_update},
    programs::TcContext,
};
use ebpf_common::DropReason;
use network_types::{ip::Ipv6Hdr, tcp::TcpHdr, udp::UdpHdr};

use crate::{
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{Flow6, IP_OFFSET, L4_OFFSET, PROTO_ICMPV6},
    rewrite::Side,
};

/// `bpf_l4_csum_replace`: the pseudo-header is IPv6's (not in aya-ebpf's bindings yet).
const BPF_F_IPV6: u64 = 1 << 7;

/// Sets `side` of the packet's flow to `addr:port`.
#[inline(always)]
pub fn rewrite(ctx: &TcContext, flow: &Flow6, side: Side, addr: &[u8; 16], port: u16) -> Result<(), DropReason> {
    let k = &flow.key;
    let (old_addr, old_port) = match side {
        Side::Source => (&k.src_addr, k.src_port),
        Side::Destination => (&k.dst_addr, k.dst_port),
    };
    let port_at = match (k.protocol, side) {
        // ICMPv6 echo: the identifier, whichever side.
        (PROTO_ICMPV6, _) => L4_OFFSET + 4,
        (_, Side::Source) => L4_OFFSET,
        (_, Side::Destination) => L4_OFFSET + 2,
    };
    let (csum_at, mangled) = match k.protocol {
        PROTO_TCP => (L4_OFFSET + core::mem::offset_of!(TcpHdr, check), 0),
        // A UDP checksum of zero means "none" and must stay zero.
        PROTO_UDP => (L4_OFFSET + core::mem::offset_of!(UdpHdr, check), u64::from(BPF_F_MARK_MANGLED_0)),
        PROTO_ICMPV6 => (L4_OFFSET + 2, 0),
        _ => return Err(DropReason::NatUntranslatable),
    };
    // SAFETY: helper call over two 16-byte arrays (the flow's, and the caller's: the settings or
    // a `NAT` value), only read.
    let diff =
        unsafe { bpf_csum_diff(old_addr.as_ptr().cast_mut().cast(), 16, addr.as_ptr().cast_mut().cast(), 16, 0) };
    if diff < 0 {
        return Err(DropReason::Malformed);
    }
    // Size 0: `to` is a checksum difference already computed.
    let flags = u64::from(BPF_F_PSEUDO_HDR) | mangled;
    if ctx.l4_csum_replace(csum_at, 0, diff as u64, flags | BPF_F_IPV6).is_err() {
        // A UDP checksum of 0 ("none") is left alone, `skb->csum` with it.
        let none = mangled != 0 && ctx.load::<u16>(csum_at).map_err(|_| DropReason::Malformed)? == 0;
        ctx.l4_csum_replace(csum_at, 0, diff as u64, flags).map_err(|_| DropReason::Malformed)?;
        if !none {
            // SAFETY: plain helper call; it changes `skb->csum` only for CHECKSUM_COMPLETE.
            unsafe { bpf_csum_update(ctx.skb.skb, diff as u32) };
        }
    }
    if old_port != port {
        let (from_port, to_port) = (u64::from(old_port.to_be()), u64::from(port.to_be()));
        ctx.l4_csum_replace(csum_at, from_port, to_port, mangled | 2).map_err(|_| DropReason::Malformed)?;
        ctx.store(port_at, &port.to_be_bytes(), 0).map_err(|_| DropReason::Malformed)?;
    }
    let addr_at = match side {
        Side::Source => IP_OFFSET + core::mem::offset_of!(Ipv6Hdr, src_addr),
        Side::Destination => IP_OFFSET + core::mem::offset_of!(Ipv6Hdr, dst_addr),
    };
    ctx.store(addr_at, addr, 0).map_err(|_| DropReason::Malformed)
}
