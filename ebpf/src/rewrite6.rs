//! Rewrites one side (address and port) of an IPv6 flow in place (`rewrite.rs` for IPv4).
//! IPv6 has no header checksum; the L4 checksum covers the addresses through the
//! pseudo-header, ICMPv6's too (unlike ICMPv4's), so each translation fixes it.
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use ebpf_common::DropReason;
use network_types::{ip::Ipv6Hdr, tcp::TcpHdr, udp::UdpHdr};

use crate::{
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{Flow6, IP_OFFSET, L4_OFFSET, PROTO_ICMPV6},
    rewrite::Side,
};

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
    ctx.l4_csum_replace(csum_at, 0, diff as u64, u64::from(BPF_F_PSEUDO_HDR) | mangled)
        .map_err(|_| DropReason::Malformed)?;
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
