//! Flows the node's stack must keep seeing (`FLOWS`): which way a flow's packets go is decided
//! per flow, so that netfilter's conntrack sees either every packet of a flow or none of it.

/// A flow as it appears on the wire in one direction: the key of `NAT` and `FLOWS`. Ports are in
/// host byte order so that `bpftool map dump` prints the numbers people expect. ICMP echo uses
/// its identifier as the source port of a request and the destination port of a reply, and 0 for
/// the other port; other protocols, ICMP errors and fragments have 0 for both.
///
/// Aligned to 8 (no change to its 40 bytes or their places): the addresses then start on
/// 8-byte boundaries, and the BPF programs copy them a word at a time rather than byte by byte
/// (each byte a register, most of them spilled onto the 512-byte stack).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub family: u8,
    /// IP protocol number: 6 TCP, 17 UDP, 1 ICMP.
    pub protocol: u8,
    pub pad: [u8; 2],
    pub src_port: u16,
    pub dst_port: u16,
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

/// What is known of a flow in `FLOWS`, keyed by the packets that will be looked up: the replies.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowEntry {
    /// The attachment whose pod the flow belongs to: DEL removes its entries.
    pub owner: u64,
    /// `bpf_ktime_get_ns` of the last packet seen either way (written at most once a second).
    pub last_seen_ns: u64,
    /// [`FLOW_VIA_STACK`] and/or [`FLOW_FROM_OUTSIDE`], [`FLOW_CONFIRMED`]; for TCP
    /// [`FLOW_FIN`], [`FLOW_RST`].
    pub flags: u32,
    pub pad: u32,
}

/// How long a UDP or ICMP flow's entry holds without a packet: longer than conntrack keeps the
/// flow (`nf_conntrack_udp_timeout_stream` 120 s, ICMP 30 s), so that no reply it would still
/// translate takes a fast path. A TCP flow's entry holds until a pod's SYN opens a new
/// connection with its addresses and ports (the fast path then forgets it), the LRU, or
/// [`FLOW_TIMEOUT_TCP_NS`] without a packet: the established timeout kube-proxy gives conntrack
/// (24 h), so that a Service connection idle that long still has its replies taken through the
/// stack. Forged packets cannot make such entries (see `FLOW_FROM_OUTSIDE`), so long is safe.
pub const FLOW_TIMEOUT_UDP_NS: u64 = 180 * 1_000_000_000;
pub const FLOW_TIMEOUT_TCP_NS: u64 = 24 * 60 * 60 * 1_000_000_000;
pub const FLOW_TIMEOUT_ICMP_NS: u64 = 60 * 1_000_000_000;

/// The node's stack delivered or sent this flow's other direction (netfilter may have
/// translated it: a Service's DNAT, kube-proxy's masquerade): these packets go through the
/// stack too, so that conntrack sees the reply and undoes its translation.
pub const FLOW_VIA_STACK: u32 = 1;
/// Opened from outside the cluster towards a pod, by its own address: the pod's replies keep
/// that address (never masqueraded). Recorded by `to_pod` for a packet that opens a flow (a TCP
/// SYN, a UDP datagram, an echo request) once the node's stack has accepted and routed it,
/// never by `from_uplink`, before netfilter: any packet from the LAN would do there.
/// Honoured only once [`FLOW_CONFIRMED`].
pub const FLOW_FROM_OUTSIDE: u32 = 2;
/// The pod answered a [`FLOW_FROM_OUTSIDE`] flow: its SYN-ACK for TCP, for UDP and echo any
/// packet within [`FLOW_CONFIRM_WINDOW_NS`] of the outside's last. Until then a record is only a
/// claim from the wire: one planted for a 5-tuple the pod uses later, or left behind a flow
/// whose translation the LRU dropped, must not send the pod's own flow out unmasqueraded.
pub const FLOW_CONFIRMED: u32 = 4;
/// How soon the pod's first answer must follow the outside's packet for a record to be
/// confirmed: a server answers within milliseconds, while a record planted by a forged datagram
/// would have to be renewed this often, for every port it guesses, to catch the pod's own flow.
pub const FLOW_CONFIRM_WINDOW_NS: u64 = 2 * 1_000_000_000;
/// A TCP flow of the stack's saw its pod's own FIN (never the peer's: conntrack lets through a
/// forged one out of the window as INVALID, and the pod answers a real one with its own): its
/// entry then holds for [`FLOW_TIMEOUT_TCP_FIN_NS`] without a packet, as long as conntrack's
/// longest state after a FIN (`FIN_WAIT`, `TIME_WAIT`: 120 s). A half-closed connection idle
/// longer than that is one conntrack has forgotten too. A new connection's SYN through the
/// stack clears it.
pub const FLOW_FIN: u32 = 8;
/// The same for the pod's own RST: [`FLOW_TIMEOUT_TCP_RST_NS`], conntrack's `CLOSE` (10 s).
pub const FLOW_RST: u32 = 16;
/// Conntrack's times plus 2 s: an entry's `last_seen_ns` is written at most once a second.
pub const FLOW_TIMEOUT_TCP_FIN_NS: u64 = 122 * 1_000_000_000;
pub const FLOW_TIMEOUT_TCP_RST_NS: u64 = 12 * 1_000_000_000;

/// How long a `FLOWS` entry of `protocol` with `flags` holds without a packet; the programs and
/// the agent judge liveness alike.
#[inline(always)]
pub const fn flow_timeout(protocol: u8, flags: u32) -> u64 {
    match protocol {
        6 if flags & FLOW_RST != 0 => FLOW_TIMEOUT_TCP_RST_NS,
        6 if flags & FLOW_FIN != 0 => FLOW_TIMEOUT_TCP_FIN_NS,
        6 => FLOW_TIMEOUT_TCP_NS,
        1 | 58 => FLOW_TIMEOUT_ICMP_NS,
        _ => FLOW_TIMEOUT_UDP_NS,
    }
}

/// The [`FLOW_FIN`] and [`FLOW_RST`] bits a TCP segment with `tcp_flags` sets.
#[inline(always)]
pub const fn flow_closing_bits(protocol: u8, tcp_flags: u8) -> u32 {
    if protocol != 6 {
        return 0;
    }
    (if tcp_flags & 0x01 != 0 { FLOW_FIN } else { 0 }) | (if tcp_flags & 0x04 != 0 { FLOW_RST } else { 0 })
}

/// Capacity of `FLOWS`: flows a Service (or the outside) opened towards this node's pods, and
/// flows this node's pods opened through the stack to other nodes. LRU: a full map forgets the
/// least recently used, whose replies would then take a fast path untranslated: sized like a
/// node's conntrack table (`nf_conntrack_max` is 131,072–262,144 on nodes of 16–32 GiB).
/// 128 Ki entries of 40 + 24 bytes, about 15 MiB of kernel memory with the LRU's overhead.
pub const FLOWS_MAX_ENTRIES: u32 = 131_072;

/// `skb->mark` of a packet the datapath itself put on an egress: sent to another node by the FIB
/// redirect (`to_uplink` then knows it did not come through the stack), or into a pod with a
/// bandwidth limit through its host veth (`to_pod` then knows the same). It never reaches netfilter (the redirect skips it),
/// and it has neither of kube-proxy's bits (0x4000 masquerade, 0x8000 drop) should it ever.
pub const FAST_PATH_MARK: u32 = 0x0ec0_0a57;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_keys_keep_their_layout() {
        // The pinned maps' key: 40 bytes, the addresses at 8 and 24, whatever the alignment.
        assert_eq!(core::mem::size_of::<FlowKey>(), 40);
        assert_eq!(core::mem::offset_of!(FlowKey, src_addr), 8);
        assert_eq!(core::mem::offset_of!(FlowKey, dst_addr), 24);
    }
}

/// Slot 0 of `STACK_EPOCH`: the stack epoch, advanced by the agent (and GC) each time it has
/// renewed the `Endpoint::stack_epoch` of every pod that still has a live [`FLOW_VIA_STACK`]
/// entry. A pod's flows need a look in `FLOWS` while its `stack_epoch` is the map's value plus
/// one (marked or renewed since the last advance) or the map's value (marked just before it):
/// [`stack_epoch_live`]. The programs mark a pod with the map's value plus one, the agent renews
/// with plus two and then advances by one, so no pod with a live flow is ever seen lapsed, and a
/// pod whose flows are gone lapses after two advances. With no agent and no GC the epoch stands
/// still and nothing lapses: the safe side.
pub const STACK_EPOCH_SLOT: u32 = 0;

/// Whether a pod whose `Endpoint::stack_epoch` is `pod` needs its flows looked up in `FLOWS`
/// while `STACK_EPOCH` holds `current`.
#[inline(always)]
pub const fn stack_epoch_live(pod: u32, current: u32) -> bool {
    pod != 0 && pod >= current
}
