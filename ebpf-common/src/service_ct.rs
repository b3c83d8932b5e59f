//! Per-packet Service translation for traffic that does not come from a local socket (NodePort,
//! LoadBalancer ingress IPs and externalIPs arriving on the uplink: `ebpf/src/service/ct.rs`
//! and its neighbours). One connection-tracking map of our own, `SVC_CT`, holds both ways of
//! each translated flow, keyed by the packet as it arrives (a [`crate::FlowKey`]):
//!
//! - the *forward* entry, keyed client → frontend, says what the client's packets become
//!   (client or node:port → backend);
//! - the *reply* entry, keyed backend → client (or → node:port when the flow was SNATed),
//!   says what the backend's packets become (frontend → client).
//!
//! An entry is created only by a packet our own state machine accepts as the start of a flow to
//! an external frontend: a TCP SYN without ACK, or a UDP datagram without state. Nothing else
//! from the LAN creates or revives state. Entries age by state ([`SVC_CT_NEW`] short, so an
//! unanswered SYN flood leaves room quickly), and each client address may open at most
//! [`SVC_CLIENT_NEW_FLOWS`] flows per [`SVC_CLIENT_WINDOW_NS`] (`SVC_CLIENTS`).

/// `Service::flags`: reachable per packet from the uplink (a NodePort, a LoadBalancer ingress
/// IP, an externalIP). A ClusterIP is not: it is the socket LB's only.
pub const SERVICE_EXTERNAL: u8 = 2;
/// `Service::flags`: `externalTrafficPolicy: Local`. The backends written are this node's only
/// (the control plane filters them by `nodeName`); the client's address is kept; with none, the
/// node does not forward (`service-no-local-endpoint`). A Service without any endpoint on any
/// node is written without this flag, so it is rejected like any other.
pub const SERVICE_EXTERNAL_LOCAL: u8 = 4;

/// `SvcCtEntry::direction`.
pub const SVC_CT_FORWARD: u8 = 1;
pub const SVC_CT_REPLY: u8 = 2;

/// `SvcCtEntry::state`: opened by the client, nothing back from the backend yet.
pub const SVC_CT_NEW: u8 = 1;
/// The backend answered (a UDP reply; for TCP its SYN-ACK and then the client's ACK: a flood
/// of SYNs from addresses that never answer the SYN-ACK stays in the short-lived states).
pub const SVC_CT_ESTABLISHED: u8 = 2;
/// The backend sent its FIN or RST (the client's, from the LAN, may be forged and closes
/// nothing: the backend answers a real one with its own).
pub const SVC_CT_CLOSING: u8 = 3;
/// TCP: the backend's SYN-ACK went out; the client has not acknowledged it yet. As short-lived
/// as [`SVC_CT_NEW`].
pub const SVC_CT_SYN_ACKED: u8 = 4;

/// Lifetimes without a packet, by state. NEW is short: a SYN nobody answers (a flood from
/// forged sources) frees its room in 10 s. ESTABLISHED TCP as kube-proxy's conntrack setting
/// (24 h); UDP as conntrack's stream timeout (120 s) plus margin; CLOSING as conntrack's
/// close-wait-ish 10 s.
pub const SVC_CT_NEW_NS: u64 = 10_000_000_000;
pub const SVC_CT_TCP_ESTABLISHED_NS: u64 = 86_400_000_000_000;
pub const SVC_CT_UDP_ESTABLISHED_NS: u64 = 180_000_000_000;
pub const SVC_CT_CLOSING_NS: u64 = 10_000_000_000;

/// Capacity of `SVC_CT` (LRU): two entries per flow, so 65,536 flows; 131,072 × (40 + 48 bytes
/// + LRU overhead) ≈ 16 MiB, preallocated.
pub const SVC_CT_MAX_ENTRIES: u32 = 131_072;
/// Capacity of `SVC_CLIENTS` (LRU): client addresses that opened a flow recently.
pub const SVC_CLIENTS_MAX_ENTRIES: u32 = 16_384;
/// New flows one client address may open per window: about 100 a second sustained, so one
/// source (a SYN flood from one address) holds at most 2 × 1,024 of `SVC_CT`'s entries in
/// NEW at a time, not the table.
pub const SVC_CLIENT_NEW_FLOWS: u32 = 1_024;
/// The window, as long as a NEW entry lives.
pub const SVC_CLIENT_WINDOW_NS: u64 = SVC_CT_NEW_NS;

/// The ports a flow to a backend on another node is SNATed to (externalTrafficPolicy
/// Cluster): above Linux's default ephemeral ports (32768–60999), the NodePorts (30000–32767)
/// and masquerade's default range (1024–29999), so a reply is ours by its port alone.
pub const SVC_SNAT_PORT_MIN: u16 = 61_000;
pub const SVC_SNAT_PORT_MAX: u16 = 65_535;

/// No-endpoint answers (TCP RST, ICMP port unreachable) each CPU may send per second; beyond,
/// the request is dropped (`service-reject-limited`), so the node is no reflector at line rate.
pub const SVC_REJECTS_PER_SECOND: u32 = 1_000;

/// Value of `SVC_CT`: the packet's source and destination become these (ports in host order).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SvcCtEntry {
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
    pub src_port: u16,
    pub dst_port: u16,
    /// [`SVC_CT_FORWARD`] or [`SVC_CT_REPLY`].
    pub direction: u8,
    /// [`SVC_CT_NEW`], [`SVC_CT_SYN_ACKED`], [`SVC_CT_ESTABLISHED`] or [`SVC_CT_CLOSING`].
    pub state: u8,
    pub pad: [u8; 2],
    /// `bpf_ktime_get_ns` of this direction's last packet (written at most once a second).
    pub last_seen_ns: u64,
}

/// Value of `SVC_CLIENTS` (keyed by `IpKey`): flows opened in the current window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SvcClient {
    pub window_start_ns: u64,
    pub opened: u32,
    pub pad: u32,
}

/// Value of `SVC_REJECTS` (per CPU, one slot): answers sent in the current second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SvcRejectBudget {
    pub second_start_ns: u64,
    pub sent: u32,
    pub pad: u32,
}

/// The lifetime of an entry in `state` for `protocol` (6 TCP, else UDP).
#[inline(always)]
pub const fn svc_ct_lifetime_ns(protocol: u8, state: u8) -> u64 {
    match state {
        SVC_CT_NEW | SVC_CT_SYN_ACKED => SVC_CT_NEW_NS,
        SVC_CT_CLOSING => SVC_CT_CLOSING_NS,
        _ if protocol == 6 => SVC_CT_TCP_ESTABLISHED_NS,
        _ => SVC_CT_UDP_ESTABLISHED_NS,
    }
}
