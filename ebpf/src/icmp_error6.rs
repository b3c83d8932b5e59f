//! ICMPv6 errors about masqueraded IPv6 flows (`icmp_error.rs` for IPv4): destination
//! unreachable, packet too big (IPv6 routers never fragment, so without it a pod behind
//! masquerade never learns the path MTU and its large TCP segments vanish), time exceeded and
//! parameter problem come back to the node's address quoting the packet as it left, from the
//! node's address and port. They are translated back like replies, the quote included, and
//! handed to the stack, whose conntrack relates them to the pod's flow.
//!
//! The ICMPv6 checksum covers the pseudo-header (so the outer destination) and the whole
//! message (so the quote): every change is added to it, as the quoted checksum's own change is.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, DropReason, FlowKey, ForwardPath, IpKey};

use crate::{
    checksum::{Delta, store, update_checksum},
    flow::{PROTO_TCP, PROTO_UDP},
    flow6::{self, IP_OFFSET, L4_OFFSET, PROTO_ICMPV6},
    maps, packet,
};

const ERRORS: core::ops::RangeInclusive<u8> = 1..=4;
const ECHO_REQUEST: u8 = 128;
/// The quoted IPv6 header follows the ICMPv6 header's 8 bytes; its L4 header follows it.
pub const INNER_AT: usize = L4_OFFSET + 8;
pub const INNER_L4: usize = INNER_AT + 40;

/// Translates an ICMPv6 error to the node back to the pod whose masqueraded flow it quotes;
/// anything else goes on to the node unchanged. Only for packets [`is_error`] says are errors.
/// A BPF function of its own: `from_uplink6`'s frame and this one's need not fit the stack
/// together.
#[inline(never)]
pub fn translate(ctx: &TcContext, config: &DatapathConfig) -> i32 {
    match rewrite(ctx, config) {
        Ok(true) => maps::forwarded(ctx, ForwardPath::ReplyToPod, packet::PASS),
        Ok(false) => packet::PASS,
        Err(reason) => maps::drop(ctx, reason),
    }
}

/// Whether the packet is an ICMPv6 error (it quotes a packet rather than carrying ports).
#[inline(always)]
pub fn is_error(ctx: &TcContext) -> bool {
    ctx.load::<u8>(IP_OFFSET + 6).is_ok_and(|next| next == PROTO_ICMPV6)
        && ctx.load::<u8>(L4_OFFSET).is_ok_and(|t| ERRORS.contains(&t))
}

/// For an ICMPv6 error: the key of the flow it quotes, in the direction the error travels (the
/// quoted packet's reply), to look up in `FLOWS`; `None` for anything else.
#[inline(always)]
pub fn quoted_reply_key(ctx: &TcContext) -> Option<FlowKey> {
    if !is_error(ctx) {
        return None;
    }
    let protocol = ctx.load::<u8>(INNER_AT + 6).ok()?;
    let head = ctx.load::<[u8; 8]>(INNER_L4).ok()?;
    let (src_port, dst_port) = match protocol {
        PROTO_TCP | PROTO_UDP => (u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]])),
        PROTO_ICMPV6 if head[0] == ECHO_REQUEST => (u16::from_be_bytes([head[4], head[5]]), 0),
        _ => return None,
    };
    let mut key = flow6::key(protocol, [0; 16], dst_port, [0; 16], src_port);
    [key.dst_addr, key.src_addr] = ctx.load::<[[u8; 16]; 2]>(INNER_AT + 8).ok()?;
    Some(key)
}

#[inline(always)]
fn rewrite(ctx: &TcContext, config: &DatapathConfig) -> Result<bool, DropReason> {
    let Ok(protocol) = ctx.load::<u8>(INNER_AT + 6) else { return Ok(false) };
    let Ok([src, dst]) = ctx.load::<[[u8; 16]; 2]>(INNER_AT + 8) else { return Ok(false) };
    let Ok(head) = ctx.load::<[u8; 8]>(INNER_L4) else { return Ok(false) };
    if src != config.node_ipv6 {
        return Ok(false);
    }
    let (port_at, src_port, dst_port, csum_at) = match protocol {
        PROTO_TCP => (INNER_L4, u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]), 16),
        PROTO_UDP => (INNER_L4, u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]), 6),
        PROTO_ICMPV6 if head[0] == ECHO_REQUEST => (INNER_L4 + 4, u16::from_be_bytes([head[4], head[5]]), 0, 2),
        _ => return Ok(false),
    };
    // The quoted packet's reply, as `NAT` keys it, finds the pod's address and port.
    let key = flow6::key(protocol, dst, dst_port, src, src_port);
    // SAFETY: the value is copied out at once.
    let Some(entry) = (unsafe { maps::NAT.get(&key).copied() }) else { return Ok(false) };
    let (pod, pod_port) = (entry.addr, entry.port);
    // A deleted pod's flow (DEL leaves its entries to age): not for the pod that has its
    // address now.
    if maps::ENDPOINTS.get_ptr(&IpKey::v6(pod)).is_none_or(|e| unsafe { (*e).owner } != entry.owner) {
        return Ok(false);
    }

    let addr_delta = Delta::of(&config.node_ipv6, &pod);
    let port_delta = Delta::of(&src_port.to_be_bytes(), &pod_port.to_be_bytes());
    // The outer destination (pseudo-header) and the quoted source: the same change, twice.
    let mut icmp_delta = addr_delta.plus(addr_delta).plus(port_delta);
    store(ctx, INNER_AT + 8, &pod)?;
    store(ctx, port_at, &pod_port.to_be_bytes())?;
    // The quoted L4 checksum covers its pseudo-header and port (or identifier) too; updated
    // when quoted that far and, for UDP, unless 0 ("none": not allowed in IPv6, but seen).
    let at = INNER_L4 + csum_at;
    if let Ok(old) = ctx.load::<[u8; 2]>(at)
        && !(protocol == PROTO_UDP && old == [0, 0])
    {
        update_checksum(ctx, at, addr_delta.plus(port_delta), &mut icmp_delta)?;
    }
    icmp_delta.apply(ctx, L4_OFFSET + 2)?;
    store(ctx, IP_OFFSET + 24, &pod)?;
    Ok(true)
}
