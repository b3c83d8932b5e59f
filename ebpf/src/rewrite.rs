//! Rewrites one side (address and port) of a flow in place, fixing the IPv4 header checksum and
//! the L4 checksum incrementally. The helpers also handle `CHECKSUM_PARTIAL` packets (offloaded
//! checksums from veths), where only the pseudo-header part of the L4 checksum is in the packet.
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use ebpf_common::DropReason;
use network_types::{icmp::Icmpv4Hdr, ip::Ipv4Hdr, tcp::TcpHdr, udp::UdpHdr};

use crate::flow::{Flow, IP_OFFSET, PROTO_ICMP, PROTO_TCP, PROTO_UDP};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Source,
    Destination,
}

/// Sets `side` of the packet's flow to `addr:port`.
#[inline(always)]
pub fn rewrite(ctx: &TcContext, flow: &Flow, side: Side, addr: [u8; 4], port: u16) -> Result<(), DropReason> {
    let (old_addr, old_port) = match side {
        Side::Source => (flow.src, flow.src_port),
        Side::Destination => (flow.dst, flow.dst_port),
    };
    // Where the port and the L4 checksum are; ICMP echo's identifier stands in for the port,
    // and ICMP's checksum does not cover the IP addresses.
    let (port_at, csum_at, pseudo_header, zero_means_none) = match flow.protocol {
        PROTO_TCP => {
            let port = if side == Side::Source { 0 } else { 2 };
            (flow.l4 + port, flow.l4 + core::mem::offset_of!(TcpHdr, check), true, false)
        }
        PROTO_UDP => {
            let port = if side == Side::Source { 0 } else { 2 };
            (flow.l4 + port, flow.l4 + core::mem::offset_of!(UdpHdr, check), true, true)
        }
        PROTO_ICMP => (flow.l4 + core::mem::offset_of!(Icmpv4Hdr, data), flow.l4 + 2, false, false),
        _ => return Err(DropReason::NatUntranslatable),
    };
    // A UDP checksum of zero means "none" and must stay zero.
    let mangled = if zero_means_none { u64::from(BPF_F_MARK_MANGLED_0) } else { 0 };
    let (from_addr, to_addr) = (u64::from(u32::from_ne_bytes(old_addr)), u64::from(u32::from_ne_bytes(addr)));
    if pseudo_header {
        ctx.l4_csum_replace(csum_at, from_addr, to_addr, u64::from(BPF_F_PSEUDO_HDR) | mangled | 4)
            .map_err(|_| DropReason::Malformed)?;
    }
    if old_port != port {
        let (from_port, to_port) = (u64::from(old_port.to_be()), u64::from(port.to_be()));
        ctx.l4_csum_replace(csum_at, from_port, to_port, mangled | 2).map_err(|_| DropReason::Malformed)?;
        ctx.store(port_at, &port.to_be_bytes(), 0).map_err(|_| DropReason::Malformed)?;
    }
    rewrite_address(ctx, side, old_addr, addr)
}

/// Sets `side`'s address (now `old`) to `addr`, fixing the IPv4 header checksum only: for what
/// has no L4 header to fix (later fragments) or had it fixed already.
#[inline(always)]
pub fn rewrite_address(ctx: &TcContext, side: Side, old: [u8; 4], addr: [u8; 4]) -> Result<(), DropReason> {
    let addr_at = match side {
        Side::Source => IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, src_addr),
        Side::Destination => IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, dst_addr),
    };
    let (from, to) = (u64::from(u32::from_ne_bytes(old)), u64::from(u32::from_ne_bytes(addr)));
    ctx.l3_csum_replace(IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, check), from, to, 4)
        .map_err(|_| DropReason::Malformed)?;
    ctx.store(addr_at, &addr, 0).map_err(|_| DropReason::Malformed)
}
