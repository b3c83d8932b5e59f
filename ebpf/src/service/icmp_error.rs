//! ICMP errors about flows `svc_from_uplink` translates (destination unreachable, fragmentation
//! needed, time exceeded, parameter problem). Each quotes a packet of the flow as its sender saw
//! it, which the other side never sent: without translation a router's "fragmentation needed"
//! never teaches the backend the path MTU, and a backend's "port unreachable" reaches the client
//! from an address it never called, quoting a datagram it never sent.
//!
//! The quoted packet, reversed, is the key of the `SVC_CT` entry that made it: the error is
//! translated as that entry's other way (the quote as the other side sent it, the outer
//! destination that side's address) and sent where that side's packets go. Only a live entry
//! translates: an error never creates, refreshes or closes state, and one quoting no live flow
//! goes on untouched (to `from_uplink` and the node's stack, or `to_uplink`), as before.
//!
//! Checksums as in `crate::icmp_error`: the quoted header's and its L4 checksum (when quoted)
//! follow the quote's changes, the ICMP checksum every byte changed inside the message; the
//! outer header's with its addresses.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ForwardPath, SVC_CT_FORWARD, SVC_CT_REPLY, SvcCtEntry};
use network_types::ip::Ipv4Hdr;

use super::ct;
use crate::{
    checksum::{Delta, store, update_checksum},
    config,
    flow::{self, IP_OFFSET, PROTO_TCP, PROTO_UDP, v4_from_16},
    icmp_error::{Quoted, quoted},
    maps, packet,
};

/// The quoted TCP or UDP packet of an ICMP error, and the live `SVC_CT` entry of the quote's
/// reverse (the way the error travels).
#[inline(always)]
fn tracked(ctx: &TcContext) -> Option<(Quoted, SvcCtEntry)> {
    let q = quoted(ctx)?;
    if q.inner.proto != PROTO_TCP && q.inner.proto != PROTO_UDP {
        return None;
    }
    let entry = ct::find(&q.reply_key())?;
    Some((q, entry))
}

/// `svc_from_uplink`: an ICMP error from the LAN about a packet this node sent for a translated
/// flow: to a client as the frontend (a router on the client's path, or the client itself), or
/// to a remote backend from the node's SNAT port (that backend's node, or a router between).
/// Translated for the backend, or for the client, and sent on as that side's packets are.
/// A BPF function of its own: `svc_from_uplink` has no stack to spare for it inlined.
#[inline(never)]
pub fn from_lan(ctx: &TcContext) -> i32 {
    let Some((q, entry)) = tracked(ctx) else { return packet::PASS };
    let Ok((outer_src, outer_dst)) = flow::addresses(ctx) else { return packet::PASS };
    let config = config::get();
    // Addressed to the quoted packet's sender, as any error is: an error to anyone else (a
    // frame to this node's MAC for another host) is not about this node's packet.
    if outer_dst != q.inner.src_addr || !super::nodeport::lan_source(config, outer_src) {
        return packet::PASS;
    }
    // A forward entry quotes the node's packet to a client (from the frontend); a reply entry
    // only the node's packet to a remote backend (from its SNAT port). A local backend's reply
    // entry names the client as the quote's source, never this node.
    let ours = match entry.direction {
        SVC_CT_FORWARD => true,
        SVC_CT_REPLY => q.inner.src_addr == config.node_ipv4,
        _ => false,
    };
    if !ours {
        return packet::PASS;
    }
    if let Err(reason) = rewrite(ctx, &q, &entry, outer_src) {
        return maps::drop(ctx, reason);
    }
    super::xlate::send(ctx, v4_from_16(entry.dst_addr))
}

/// `svc_to_uplink`: an ICMP error a local backend sends about a packet it received on a
/// translated flow (a port unreachable, a fragmentation needed): it leaves as the frontend,
/// quoting what the client sent. `to_uplink` then leaves it alone (its source is no pod's).
#[inline(always)]
pub fn from_backend(ctx: &TcContext, pod: [u8; 4]) -> i32 {
    let Some((q, entry)) = tracked(ctx) else { return packet::PASS };
    // The pod's error about a packet it received: it is the quote's destination.
    if entry.direction != SVC_CT_REPLY || q.inner.dst_addr != pod {
        return packet::PASS;
    }
    if let Err(reason) = rewrite(ctx, &q, &entry, pod) {
        return maps::drop(ctx, reason);
    }
    maps::forwarded(ctx, ForwardPath::ServiceReply, packet::PASS)
}

/// Writes the quote as the other side sent it (`entry.dst` → `entry.src`, the entry's packets
/// reversed) and the outer destination as that side's address. The outer source becomes the
/// address that side knows its peer by when the quote's destination changes (a backend's own
/// error leaves as the frontend; an error about SNATed packets comes from the node); a router
/// on a path whose addresses stay is named as it is.
#[inline(always)]
fn rewrite(ctx: &TcContext, q: &Quoted, entry: &SvcCtEntry, outer_src: [u8; 4]) -> Result<(), DropReason> {
    let (src, dst) = (v4_from_16(entry.dst_addr), v4_from_16(entry.src_addr));
    let old_addrs = [q.inner.src_addr, q.inner.dst_addr];
    let new_addrs = [src, dst];
    let old_ports = [q.head[0], q.head[1], q.head[2], q.head[3]];
    let (sp, dp) = (entry.dst_port.to_be_bytes(), entry.src_port.to_be_bytes());
    let new_ports = [sp[0], sp[1], dp[0], dp[1]];
    let mut icmp_delta = Delta::default();

    // The quoted addresses, and the quoted header's checksum with them; both lie in the ICMP
    // message, so its checksum sees both changes.
    let addr_delta = Delta::of(&flatten(old_addrs), &flatten(new_addrs));
    store(ctx, q.inner_at + core::mem::offset_of!(Ipv4Hdr, src_addr), &flatten(new_addrs))?;
    update_checksum(ctx, q.inner_at + core::mem::offset_of!(Ipv4Hdr, check), addr_delta, &mut icmp_delta)?;
    icmp_delta.add(addr_delta);

    // The quoted ports, and the quoted L4 checksum over them and its pseudo-header's
    // addresses: when quoted (TCP's lies past the 8 bytes an error must quote) and, for UDP,
    // unless 0 ("none").
    let port_delta = Delta::of(&old_ports, &new_ports);
    store(ctx, q.inner_l4, &new_ports)?;
    icmp_delta.add(port_delta);
    let l4_csum_at = match q.inner.proto {
        PROTO_UDP if q.head[6] | q.head[7] != 0 => Some(q.inner_l4 + 6),
        PROTO_TCP => Some(q.inner_l4 + 16),
        _ => None,
    };
    if let Some(at) = l4_csum_at
        && ctx.load::<[u8; 2]>(at).is_ok()
    {
        update_checksum(ctx, at, addr_delta.plus(port_delta), &mut icmp_delta)?;
    }
    icmp_delta.apply(ctx, q.l4 + 2)?;

    // The outer addresses (IPv4's ICMP checksum has no pseudo-header: only the header's).
    let outer_src = if dst != q.inner.dst_addr { dst } else { outer_src };
    let old_outer: [u8; 8] =
        ctx.load(IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, src_addr)).map_err(|_| DropReason::Malformed)?;
    let new_outer = flatten([outer_src, src]);
    store(ctx, IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, src_addr), &new_outer)?;
    Delta::of(&old_outer, &new_outer).apply(ctx, IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, check))
}

#[inline(always)]
fn flatten(a: [[u8; 4]; 2]) -> [u8; 8] {
    [a[0][0], a[0][1], a[0][2], a[0][3], a[1][0], a[1][1], a[1][2], a[1][3]]
}
