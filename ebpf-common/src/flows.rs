//! Flows the node's stack must keep seeing (`FLOWS`): which way a flow's packets go is decided
//! per flow, so that netfilter's conntrack sees either every packet of a flow or none of it.

/// A flow as it appears on the wire in one direction: the key of `NAT` and `FLOWS`. Ports are in
/// host byte order so that `bpftool map dump` prints the numbers people expect. ICMP echo uses
/// its identifier as the source port of a request and the destination port of a reply, and 0 for
/// the other port; other protocols, ICMP errors and fragments have 0 for both.
#[repr(C)]
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
    /// [`FLOW_VIA_STACK`] and/or [`FLOW_FROM_OUTSIDE`].
    pub flags: u32,
    pub pad: u32,
}

/// The node's stack delivered or sent this flow's other direction (netfilter may have
/// translated it: a Service's DNAT, kube-proxy's masquerade): these packets go through the
/// stack too, so that conntrack sees the reply and undoes its translation.
pub const FLOW_VIA_STACK: u32 = 1;
/// Opened from outside the cluster towards a pod, by its own address: the pod's replies keep
/// that address (never masqueraded).
pub const FLOW_FROM_OUTSIDE: u32 = 2;

/// Capacity of `FLOWS`: flows a Service (or the outside) opened towards this node's pods, and
/// flows this node's pods opened through the stack to other nodes. LRU: a full map forgets the
/// least recently used. 64 Ki entries of 40 + 16 bytes, about 6 MiB of kernel memory.
pub const FLOWS_MAX_ENTRIES: u32 = 65_536;

/// `skb->mark` of a packet `from_pod` sent to another node by the FIB redirect: `to_uplink` then
/// knows it did not come through the stack (and clears the mark). It never reaches netfilter.
/// A value no other user of marks sets whole (kube-proxy uses the bits 0x4000 and 0x8000).
pub const FAST_PATH_MARK: u32 = 0x0ec0_fa57;
