//! Fragmented datagrams through masquerade. Only the first fragment carries the ports that find
//! the flow; when it is translated, the address its datagram's later fragments get is kept by
//! protocol, addresses and IPv4 identification, and those fragments get it too (the L4
//! checksum, in the first fragment, already covers the whole datagram). A later fragment that
//! arrives before its first is dropped on the way out (`NatUntranslatable`) and left to the node
//! on the way in. The last fragment (more-fragments clear) removes the entry: the 16-bit
//! identification wraps, and a datagram that reuses it must not find the old one's address
//! (a later fragment arriving before its own first would go to another pod). The last may be
//! lost, so an entry also lapses `FRAGMENT_TIMEOUT_NS` after its first fragment, and is good
//! only for its own pod: the one whose flow it is, while it holds its address.
use aya_ebpf::{bindings::BPF_ANY, helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{
    DropReason, FAMILY_IPV4, FRAGMENT_TIMEOUT_NS, ForwardPath, FragmentEntry, FragmentKey, IpKey, ipv4_in_16,
};
use network_types::ip::Ipv4Hdr;

use crate::{
    flow::{self, Flow, IP_OFFSET},
    maps, packet,
    rewrite::{Side, rewrite_address},
};

/// After the first fragment of `owner`'s flow `flow` was translated: its later fragments get
/// `addr` too.
#[inline(always)]
pub fn remember(flow: &Flow, addr: [u8; 4], owner: u64) {
    let key = key(flow.protocol, flow.src, flow.dst, flow.ip_id);
    // SAFETY: plain helper call.
    let entry = FragmentEntry { addr: ipv4_in_16(addr), owner, created_ns: unsafe { bpf_ktime_get_ns() } };
    let _ = maps::FRAGMENTS.insert(&key, &entry, u64::from(BPF_ANY));
}

/// A later fragment from `owner`'s pod on its way out of the uplink: masqueraded like its first.
#[inline(always)]
pub fn egress(ctx: &TcContext, owner: u64) -> i32 {
    match translate(ctx, Side::Source, Some(owner)) {
        Some(Ok(())) => maps::forwarded(ctx, ForwardPath::Masqueraded, packet::PASS),
        Some(Err(reason)) => maps::drop(ctx, reason),
        None => maps::drop(ctx, DropReason::NatUntranslatable),
    }
}

/// A later fragment to the node's address: back to its pod like its first, else the node's.
#[inline(always)]
pub fn ingress(ctx: &TcContext) -> Option<i32> {
    Some(match translate(ctx, Side::Destination, None)? {
        Ok(()) => maps::forwarded(ctx, ForwardPath::ReplyToPod, packet::PASS),
        Err(reason) => maps::drop(ctx, reason),
    })
}

/// `None` unless the packet is a later fragment of a datagram whose first was translated, for
/// the pod that owns the entry (`sender`'s on the way out; the one at its address on the way
/// back), within `FRAGMENT_TIMEOUT_NS` of it.
#[inline(always)]
fn translate(ctx: &TcContext, side: Side, sender: Option<u64>) -> Option<Result<(), DropReason>> {
    let ip: Ipv4Hdr = ctx.load(IP_OFFSET).ok()?;
    if u16::from_be_bytes(ip.frags) & flow::FRAGMENT_BITS == 0 {
        return None;
    }
    let key = key(ip.proto, ip.src_addr, ip.dst_addr, u16::from_be_bytes(ip.id));
    // SAFETY: the value is copied out at once.
    let entry = unsafe { maps::FRAGMENTS.get(&key).copied() }?;
    // SAFETY: plain helper call.
    let stale = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.created_ns) > FRAGMENT_TIMEOUT_NS;
    if stale || u16::from_be_bytes(ip.frags) & flow::MORE_FRAGMENTS == 0 {
        let _ = maps::FRAGMENTS.remove(&key);
    }
    let owner = match sender {
        Some(owner) => owner,
        // SAFETY: a hash map value, read at once.
        None => unsafe { (*maps::ENDPOINTS.get_ptr(&IpKey::v4(flow::v4_from_16(entry.addr)))?).owner },
    };
    if stale || owner != entry.owner {
        return None;
    }
    let old = if side == Side::Source { ip.src_addr } else { ip.dst_addr };
    Some(rewrite_address(ctx, side, old, flow::v4_from_16(entry.addr)))
}

#[inline(always)]
fn key(protocol: u8, src: [u8; 4], dst: [u8; 4], id: u16) -> FragmentKey {
    FragmentKey {
        family: FAMILY_IPV4,
        protocol,
        pad: [0; 2],
        id: u32::from(id),
        src_addr: ipv4_in_16(src),
        dst_addr: ipv4_in_16(dst),
    }
}
