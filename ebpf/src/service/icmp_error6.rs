//! ICMPv6 errors about flows `svc_from_uplink6` translates (`icmp_error.rs` for IPv4, whose
//! rules these follow): destination unreachable, packet too big (IPv6 routers never fragment:
//! without it a backend's large segments to a client behind a smaller link vanish), time
//! exceeded, parameter problem. Only an outer header without extension headers quoting an IPv6
//! header followed by TCP or UDP, as `crate::icmp_error6` reads them.
//!
//! Frugal with the stack (`svc_from_uplink6`'s frame holds its ordinary path's too): the quote's
//! addresses go straight into the `SVC_CT` key, the outer ones are read in place, and nothing
//! is copied to be rewritten: the entry and the key are the new and the old values, and the
//! ICMPv6 checksum, which covers the pseudo-header (the outer addresses) and the whole message,
//! takes the sum of their differences.
use aya_ebpf::{helpers::bpf_skb_load_bytes, programs::TcContext};
use ebpf_common::{DropReason, FlowKey, ForwardPath, SVC_CT_FORWARD, SVC_CT_REPLY, SvcCtEntry};
use network_types::ip::Ipv6Hdr;

use super::{ct, xlate6};
use crate::{
    checksum::{Delta, store, update_checksum},
    config,
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{self, IP_OFFSET, L4_OFFSET},
    icmp_error6::{INNER_AT, INNER_L4, is_error},
    maps, packet,
};

/// Offsets of the addresses in an IPv6 header.
const SRC: usize = 8;
const DST: usize = 24;

/// The key of the `SVC_CT` entry that made the quoted packet, reversed (the way the error
/// travels: the quote's source is the key's destination), and that entry while it lives.
#[inline(always)]
fn tracked(ctx: &TcContext) -> Option<(FlowKey, SvcCtEntry)> {
    if !is_error(ctx) || ctx.load::<u8>(INNER_AT).ok()? >> 4 != 6 {
        return None;
    }
    let protocol = ctx.load::<u8>(INNER_AT + 6).ok()?;
    if protocol != PROTO_TCP && protocol != PROTO_UDP {
        return None;
    }
    // All an error must quote of the L4 header: shorter, it is no quote of our packet.
    let head = ctx.load::<[u8; 8]>(INNER_L4).ok()?;
    let (src_port, dst_port) = (u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]));
    let mut key = flow6::key(protocol, [0; 16], dst_port, [0; 16], src_port);
    load_into(ctx, INNER_AT + DST, &mut key.src_addr)?;
    load_into(ctx, INNER_AT + SRC, &mut key.dst_addr)?;
    let entry = ct::find(&key)?;
    Some((key, entry))
}

/// 16 bytes at `at` straight into `to` (a `ctx.load` would make a copy on the stack first).
#[inline(always)]
fn load_into(ctx: &TcContext, at: usize, to: &mut [u8; 16]) -> Option<()> {
    let to: *mut [u8; 16] = to;
    // SAFETY: `to` is 16 writable bytes.
    let loaded = unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), at as u32, to.cast(), 16) };
    (loaded == 0).then_some(())
}

/// `svc_from_uplink6`: as `icmp_error::from_lan` (a router's or the client's error about the
/// node's packet to the client, or one about the node's packet to a remote backend), sent on as
/// the flow's packets are. A BPF function of its own, for `svc_from_uplink6`'s stack.
#[inline(never)]
pub fn from_lan(ctx: &TcContext) -> i32 {
    let Some((key, entry)) = tracked(ctx) else { return packet::PASS };
    let config = config::get();
    let Some(ip) = packet::header_mut::<Ipv6Hdr>(ctx, IP_OFFSET) else { return packet::PASS };
    // SAFETY: bounds checked by `header_mut`; nothing changes the packet while these are read.
    let (outer_src, outer_dst) = unsafe { (&(*ip).src_addr, &(*ip).dst_addr) };
    // Addressed to the quoted packet's sender, from a peer on the LAN (see `icmp_error.rs`).
    if *outer_dst != key.dst_addr || !super::nodeport6::lan_source(config, outer_src) {
        return packet::PASS;
    }
    // A reply entry only for the node's packet to a remote backend (from its SNAT port).
    let ours = match entry.direction {
        SVC_CT_FORWARD => true,
        SVC_CT_REPLY => key.dst_addr == config.node_ipv6,
        _ => false,
    };
    if !ours {
        return packet::PASS;
    }
    if let Err(reason) = rewrite(ctx, &key, &entry) {
        return maps::drop(ctx, reason);
    }
    xlate6::send(ctx, &entry.dst_addr)
}

/// `svc_to_uplink6`: as `icmp_error::from_backend`, a local backend's error about a packet it
/// received on a translated flow leaves as the frontend, quoting what the client sent.
#[inline(always)]
pub fn from_backend(ctx: &TcContext) -> i32 {
    let Some((key, entry)) = tracked(ctx) else { return packet::PASS };
    let Some(ip) = packet::header_mut::<Ipv6Hdr>(ctx, IP_OFFSET) else { return packet::PASS };
    // SAFETY: bounds checked by `header_mut`.
    let pod = unsafe { &(*ip).src_addr };
    // The pod's error about a packet it received: it is the quote's destination.
    if entry.direction != SVC_CT_REPLY || *pod != key.src_addr || !config::get().in_node_pods6(pod) {
        return packet::PASS;
    }
    if let Err(reason) = rewrite(ctx, &key, &entry) {
        return maps::drop(ctx, reason);
    }
    maps::forwarded(ctx, ForwardPath::ServiceReply, packet::PASS)
}

/// As `icmp_error::rewrite`: the quote becomes the entry's packet reversed (`entry.dst` →
/// `entry.src`, `key` being the old one reversed), the outer destination `entry.dst`, the outer
/// source `entry.src` when the quote's destination changes (else a router is named as it is).
#[inline(always)]
fn rewrite(ctx: &TcContext, key: &FlowKey, entry: &SvcCtEntry) -> Result<(), DropReason> {
    let ip = packet::header_mut::<Ipv6Hdr>(ctx, IP_OFFSET).ok_or(DropReason::Malformed)?;
    let new_outer_src = entry.src_addr != key.src_addr;
    // The outer addresses, read in place before any store moves the packet.
    // SAFETY: bounds checked by `header_mut`.
    let outer_delta = unsafe {
        let src = if new_outer_src { Delta::of_addresses(&(*ip).src_addr, &entry.src_addr) } else { Delta::default() };
        src.plus(Delta::of_addresses(&(*ip).dst_addr, &entry.dst_addr))
    };
    let addr_delta =
        Delta::of_addresses(&key.dst_addr, &entry.dst_addr).plus(Delta::of_addresses(&key.src_addr, &entry.src_addr));
    let (old_src, old_dst) = (key.dst_port.to_be_bytes(), key.src_port.to_be_bytes());
    let (new_src, new_dst) = (entry.dst_port.to_be_bytes(), entry.src_port.to_be_bytes());
    let new_ports = [new_src[0], new_src[1], new_dst[0], new_dst[1]];
    let port_delta = Delta::of(&[old_src[0], old_src[1], old_dst[0], old_dst[1]], &new_ports);
    // The pseudo-header's addresses, the quoted ones and ports (message).
    let mut icmp_delta = outer_delta.plus(addr_delta).plus(port_delta);
    store(ctx, INNER_AT + SRC, &entry.dst_addr)?;
    store(ctx, INNER_AT + DST, &entry.src_addr)?;
    store(ctx, INNER_L4, &new_ports)?;
    // The quoted L4 checksum (its pseudo-header and ports), when quoted that far (TCP's lies
    // past the 8 bytes an error must quote) and, for UDP, unless 0 ("none").
    let at = INNER_L4 + if key.protocol == PROTO_TCP { 16 } else { 6 };
    if let Ok(old) = ctx.load::<[u8; 2]>(at)
        && !(key.protocol == PROTO_UDP && old == [0, 0])
    {
        update_checksum(ctx, at, addr_delta.plus(port_delta), &mut icmp_delta)?;
    }
    icmp_delta.apply(ctx, L4_OFFSET + 2)?;
    if new_outer_src {
        store(ctx, IP_OFFSET + SRC, &entry.src_addr)?;
    }
    store(ctx, IP_OFFSET + DST, &entry.dst_addr)
}
