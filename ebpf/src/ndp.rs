//! Neighbour discovery, IPv6's ARP: a pod asking for any address other than its own (its
//! gateway, in practice) is answered with the host-side veth's MAC, in place and back out of the
//! same veth, as `arp.rs` does for IPv4. No bridge, no proxy-NDP entries in the node.
use aya_ebpf::{helpers::bpf_csum_diff, helpers::bpf_redirect, programs::TcContext};
use ebpf_common::{DropReason, Endpoint, ForwardPath, IpKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{maps, packet};

pub const PROTO_ICMPV6: u8 = 58;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;
/// Option types: the sender's MAC in a solicitation, the target's in an advertisement.
const SOURCE_LINK_ADDRESS: u8 = 1;
const TARGET_LINK_ADDRESS: u8 = 2;
/// Router, Solicited, Override: the answer comes from the pod's router (its gateway), answers
/// this solicitation, and replaces whatever the pod's cache held.
const ADVERT_FLAGS: [u8; 4] = [0xe0, 0, 0, 0];
/// RFC 4861 §7.1: neighbour discovery never crosses a router, so it arrives with 255.
const ND_HOP_LIMIT: u8 = 255;

const ICMP_AT: usize = EthHdr::LEN + Ipv6Hdr::LEN;

/// A solicitation or advertisement with one link-address option: what a pod's stack sends once
/// it has an address of its own (a solicitation from `::`, during duplicate address
/// detection, has no option and is left to the stack). network-types has no ND messages.
#[repr(C)]
struct NeighborMessage {
    icmp_type: u8,
    code: u8,
    checksum: [u8; 2],
    flags: [u8; 4],
    target: [u8; 16],
    option_type: u8,
    /// In units of 8 bytes: 1 for an Ethernet address.
    option_len: u8,
    option_mac: [u8; 6],
}

/// A whole solicitation frame as the pod sends it.
#[repr(C)]
struct NeighborFrame {
    eth: EthHdr,
    ip: Ipv6Hdr,
    msg: NeighborMessage,
}

/// The ICMPv6 type of a packet whose next header is ICMPv6, if it has one.
#[inline(always)]
pub fn icmp_type(ctx: &TcContext) -> Option<u8> {
    ctx.load::<u8>(ICMP_AT).ok()
}

/// Answers a solicitation from `own` for any target but its own addresses; anything else
/// (other lengths, options, its own address) goes to the stack.
#[inline(always)]
pub fn solicitation(ctx: &TcContext, own: &Endpoint) -> i32 {
    // One bounds check, one pointer: three would leave the compiler room to pack them in ways
    // the verifier refuses (shifts of packet pointers).
    let Some(frame) = packet::header_mut::<NeighborFrame>(ctx, 0) else {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    };
    // SAFETY: bounds checked by `header_mut`.
    let NeighborFrame { eth, ip, msg } = unsafe { &mut *frame };
    let whole = u16::from_be_bytes(ip.payload_len) as usize == core::mem::size_of::<NeighborMessage>();
    if !whole || msg.option_type != SOURCE_LINK_ADDRESS || msg.option_len != 1 || own_address(&msg.target, own) {
        return maps::forwarded(ctx, ForwardPath::ToStack, packet::PASS);
    }
    msg.icmp_type = NEIGHBOR_ADVERTISEMENT;
    msg.code = 0;
    msg.flags = ADVERT_FLAGS;
    msg.option_type = TARGET_LINK_ADDRESS;
    // The host MAC (here and in the Ethernet header below) not by assignment, which compiled to
    // a call of a byte-by-byte `memmove` (packet and map value: the verifier walked both of its
    // loops). SAFETY: six bytes each, a map value's into the packet's (bounds checked above).
    unsafe { core::ptr::copy_nonoverlapping(own.host_mac.as_ptr(), msg.option_mac.as_mut_ptr(), 6) };
    ip.dst_addr = ip.src_addr;
    ip.src_addr = msg.target;
    ip.hop_limit = ND_HOP_LIMIT;
    eth.dst_addr = eth.src_addr;
    // SAFETY: as above.
    unsafe { core::ptr::copy_nonoverlapping(own.host_mac.as_ptr(), eth.src_addr.as_mut_ptr(), 6) };
    msg.checksum = [0; 2];
    let Some(sum) = checksum(ip, msg) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    msg.checksum = sum;
    // Back out of the same veth: its egress is the pod's ingress.
    // SAFETY: plain helper call.
    maps::forwarded(ctx, ForwardPath::Answered, unsafe { bpf_redirect(own.host_ifindex, 0) } as i32)
}

/// An advertisement from the pod may only speak for one of the pod's addresses, with its MAC.
#[inline(always)]
pub fn advertisement_is_own(ctx: &TcContext, own: &Endpoint) -> bool {
    let Some(msg) = packet::header_mut::<NeighborMessage>(ctx, ICMP_AT) else {
        // Shorter: no option, so no MAC to check; the target still must be the pod's.
        return ctx.load::<[u8; 16]>(ICMP_AT + 8).is_ok_and(|target| own_address(&target, own));
    };
    // SAFETY: bounds checked by `header_mut`.
    let msg = unsafe { &*msg };
    let mac_ok = msg.option_type != TARGET_LINK_ADDRESS || msg.option_mac == own.pod_mac;
    mac_ok && own_address(&msg.target, own)
}

pub fn is_advertisement(icmp_type: u8) -> bool {
    icmp_type == NEIGHBOR_ADVERTISEMENT
}

pub fn is_solicitation(icmp_type: u8) -> bool {
    icmp_type == NEIGHBOR_SOLICITATION
}

/// Whether `addr` is one of the pod's (its link-local address has an entry too).
#[inline(always)]
fn own_address(addr: &[u8; 16], own: &Endpoint) -> bool {
    // SAFETY: a hash map value, valid while this program runs.
    maps::ENDPOINTS.get_ptr(&IpKey::v6_words(*addr)).is_some_and(|e| unsafe { (*e).owner } == own.owner)
}

/// The ICMPv6 checksum over the pseudo-header (addresses, length, next header) and the message.
#[inline(always)]
fn checksum(ip: &mut Ipv6Hdr, msg: &mut NeighborMessage) -> Option<[u8; 2]> {
    let len = core::mem::size_of::<NeighborMessage>() as u32;
    let mut rest = [len.to_be(), u32::from(PROTO_ICMPV6).to_be()];
    let addresses: *mut [u8; 16] = &mut ip.src_addr;
    // SAFETY: helper calls over memory the caller bounds-checked (source and destination
    // address are adjacent in the header) and a stack array.
    let sum = unsafe {
        let sum = bpf_csum_diff(core::ptr::null_mut(), 0, addresses.cast(), 32, 0);
        let sum = bpf_csum_diff(core::ptr::null_mut(), 0, rest.as_mut_ptr(), 8, sum as u32);
        bpf_csum_diff(core::ptr::null_mut(), 0, (msg as *mut NeighborMessage).cast(), len, sum as u32)
    };
    if sum < 0 {
        return None;
    }
    let mut sum = sum as u64;
    for _ in 0..3 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    Some((!(sum as u16)).to_ne_bytes())
}
