//! Source NAT (masquerade) state: one LRU map holding both directions of every translated flow,
//! keyed by [`crate::FlowKey`].

/// Capacity of `NAT`: two entries per flow (egress and reply), so 32 Ki masqueraded flows per
/// node at once. An LRU map, so when it is full the least recently used flow is forgotten
/// rather than a new one refused. About 9 MiB of kernel memory (40 + 40 bytes plus the
/// kernel's per-element overhead).
pub const NAT_MAX_ENTRIES: u32 = 65_536;

/// What a flow's address and port are rewritten to. For an egress entry (key: pod → outside) it
/// is the node's address and the allocated port, which replace the source; for a reply entry
/// (key: outside → node) it is the pod's address and port, which replace the destination.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatEntry {
    pub addr: [u8; 16],
    pub port: u16,
    /// [`NAT_EGRESS`] or [`NAT_REPLY`], so a dump reads without knowing the addresses.
    pub direction: u8,
    /// Non-zero once a TCP flow is ending, when its port is free again after
    /// [`NAT_TIMEOUT_TCP_CLOSING_NS`] rather than the established timeout:
    /// [`NAT_CLOSING_BY_POD`] or [`NAT_CLOSING_PEER_RESET`].
    pub closing: u8,
    pub pad: [u8; 4],
    /// The attachment (container ID + ifname) whose pod owns the flow. An entry is valid for
    /// its owner only: the programs ignore it once another attachment holds the pod's address.
    pub owner: u64,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) of the last packet either way.
    pub last_seen_ns: u64,
}

pub const NAT_EGRESS: u8 = 1;

/// The pod sent FIN or RST: its own stack says the flow ends. For good.
pub const NAT_CLOSING_BY_POD: u8 = 1;
/// A RST came from the outside. Anyone on the path may forge one, so the pod's next packet
/// (anything but FIN or RST: the connection lives) takes it back. An inbound FIN is a
/// half-close and marks nothing: the pod's own FIN follows when it closes too.
pub const NAT_CLOSING_PEER_RESET: u8 = 2;
pub const NAT_REPLY: u8 = 2;

/// How long a flow may stay idle before another flow may take its port. An idle flow keeps
/// working until its port is needed: expiry only allows reuse, the LRU does the forgetting.
pub const NAT_TIMEOUT_TCP_NS: u64 = 2 * 60 * 60 * 1_000_000_000;
/// A TCP flow after FIN or RST: long enough for the last ACKs and a retransmitted FIN.
pub const NAT_TIMEOUT_TCP_CLOSING_NS: u64 = 10 * 1_000_000_000;
pub const NAT_TIMEOUT_UDP_NS: u64 = 60 * 1_000_000_000;
pub const NAT_TIMEOUT_ICMP_NS: u64 = 30 * 1_000_000_000;

/// Ports tried for a new flow, drawn at random from the configured range (never the pod's own
/// port: only the range is kept clear of the node's sockets). 32 tries find a free port with
/// probability above 1 − 0.9³² ≈ 97 % even when 90 % of the range is taken for that destination.
pub const NAT_PORT_TRIES: u32 = 32;

/// A fragmented datagram whose first fragment was translated, as its later fragments (which
/// carry no ports) show it: protocol, addresses as on the wire, IPv4 identification.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentKey {
    pub family: u8,
    pub protocol: u8,
    pub pad: [u8; 2],
    /// The IPv4 identification (IPv6's fragment header has 32 bits).
    pub id: u32,
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

/// The address a translated datagram's later fragments get: the node's on the way out (it
/// replaces the source), the pod's on the way back (it replaces the destination).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentEntry {
    pub addr: [u8; 16],
    /// The attachment of the pod whose flow it is: on the way back, an entry whose pod no
    /// longer holds `addr` (deleted, its address given again) is ignored.
    pub owner: u64,
    /// When the first fragment was translated (`bpf_ktime_get_ns`): an entry older than
    /// [`FRAGMENT_TIMEOUT_NS`] is ignored and removed.
    pub created_ns: u64,
}

/// How long after its first fragment a datagram's later fragments are translated. Fragments of
/// one datagram arrive within milliseconds of each other; the 16-bit IPv4 identification may
/// come round again in well under the kernel's 30 s reassembly time on a busy flow, and a later
/// fragment of the new datagram must not find the old one's entry (the last fragment removes it,
/// but it may be lost).
pub const FRAGMENT_TIMEOUT_NS: u64 = 2 * 1_000_000_000;

/// Capacity of `NODE_ECHOES`: the node's own pings to distinct destinations and identifiers
/// within 30 s. LRU: a node pings a handful of hosts. 1 Ki entries of 40 + 8 bytes.
pub const NODE_ECHOES_MAX_ENTRIES: u32 = 1_024;

/// Capacity of `FRAGMENTS`: datagrams in flight in fragments at once, both ways. LRU: a datagram
/// is done within milliseconds, and the oldest is forgotten first. 4 Ki entries of 40 + 32 bytes.
pub const FRAGMENTS_MAX_ENTRIES: u32 = 4_096;

/// Masqueraded flows a pod opened in the current window (`POD_FLOWS`, keyed by owner).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodFlows {
    /// `bpf_ktime_get_ns` when the window began.
    pub window_start_ns: u64,
    pub new_flows: u64,
}

/// The window `masqPodFlowsPerMinute` counts in.
pub const POD_FLOWS_WINDOW_NS: u64 = 60 * 1_000_000_000;

/// Capacity of `POD_FLOWS`: one entry per pod that masquerades, as many as `ENDPOINTS` has
/// addresses. 8 + 16 bytes each.
pub const POD_FLOWS_MAX_ENTRIES: u32 = crate::ENDPOINTS_MAX_ENTRIES;
