//! Services translated at connect time (the socket LB, `ebpf/src/service/`): a Service's
//! frontend (ClusterIP, port, protocol) → its backends, kept so that one Service's change is a
//! few map writes and readers never see it half-written.
//!
//! A frontend's [`Service`] names a bank (0 or 1) of its backend slots. The writer
//! (`cni-plugin/src/bpf/services.rs`) fills the other bank first, then replaces the frontend
//! entry whole (one update: a reader copies either the old or the new one), then deletes the
//! slots the new set no longer uses in the bank it left one change later, when it writes that
//! bank again: a program that copied the old entry a moment before the switch still finds the
//! slots it names.

/// `Service::flags`: `sessionAffinity: ClientIP`, the same backend for a client while it keeps
/// connecting within `affinity_timeout_s`.
pub const SERVICE_AFFINITY: u8 = 1;

/// Most backends one Service may have (the slot index is a `u16`; the writer refuses more).
pub const SERVICE_MAX_BACKENDS: u32 = 4_096;

/// Capacity of `SVC_FRONTENDS`: one entry per Service address, port and protocol (a
/// dual-stack Service with two ports has four). 65,536 × (20 + 16 bytes + the kernel's ~50 per
/// element) ≈ 6 MiB at most, allocated as written (no preallocation).
pub const SVC_FRONTENDS_MAX_ENTRIES: u32 = 65_536;
/// Capacity of `SVC_BACKENDS`: slots of both banks, so twice the backends of all Services
/// during a change. 262,144 × (8 + 20 + ~50 bytes) ≈ 20 MiB at most, allocated as written.
pub const SVC_BACKENDS_MAX_ENTRIES: u32 = 262_144;
/// Capacity of `SVC_AFFINITY` (LRU): client × ClientIP Service pairs. 65,536 × (16 + 32 bytes).
pub const SVC_AFFINITY_MAX_ENTRIES: u32 = 65_536;
/// Capacity of `SVC_SOCKETS` (LRU): sockets (and unconnected UDP peers) translated, so that
/// `getpeername`/`recvmsg` show the Service and a removed backend's sockets are found. Like
/// `FLOWS`, about a node's `nf_conntrack_max`: 131,072 × (32 + 20 bytes) ≈ 15 MiB with LRU
/// overhead.
pub const SVC_SOCKETS_MAX_ENTRIES: u32 = 131_072;

/// Key of `SVC_FRONTENDS`: what an application connects or sends to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    /// An IPv4 address in the first four bytes, the rest zero (as `IpKey`).
    pub addr: [u8; 16],
    /// Host byte order, so dumps show the number.
    pub port: u16,
    /// `IPPROTO_TCP` (6) or `IPPROTO_UDP` (17).
    pub protocol: u8,
    /// `FAMILY_IPV4` or `FAMILY_IPV6`.
    pub family: u8,
}

/// Value of `SVC_FRONTENDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Service {
    /// The Service's slots in `SVC_BACKENDS`: never reused for another Service (the writer
    /// counts up), so a reader racing a removal finds nothing rather than another's backend.
    pub id: u32,
    /// Counts the changes of this frontend's backends; `bank` is its lowest bit.
    pub revision: u32,
    /// Backends in slots `0..count` of `bank`. 0: the Service has no endpoint, and a connect
    /// or send to it is refused at once (`ECONNREFUSED`, counted as `service-no-endpoint`).
    pub count: u16,
    /// `SERVICE_AFFINITY`.
    pub flags: u8,
    pub bank: u8,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds` (Kubernetes' default 10,800).
    pub affinity_timeout_s: u32,
}

/// Key of `SVC_BACKENDS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendKey {
    pub service: u32,
    pub index: u16,
    pub bank: u8,
    pub pad: u8,
}

/// Value of `SVC_BACKENDS`, and where a translated socket connects.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    pub family: u8,
    pub pad: u8,
}

/// Key of `SVC_AFFINITY`. The client is its network namespace (`bpf_get_netns_cookie`), not
/// its address: at `connect` a socket often has no source address yet, and a pod's namespace
/// holds the pod's addresses, so it is the same client as kube-proxy's `ClientIP`. A client on
/// the LAN (per-packet flows) is its address, in `netns_cookie` with bit 63 set, which no netns
/// cookie has: an IPv4 address as a number in bits 0-31, an IPv6 one as bit 62 and a 62-bit
/// hash (`ebpf/src/service/lan_affinity.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    pub service: u32,
    pub pad: u32,
}

/// Value of `SVC_AFFINITY`: the backend a client last got, and when (`bpf_ktime_get_ns`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affinity {
    pub backend: Backend,
    pub pad: u32,
    pub last_ns: u64,
}

/// Key of `SVC_SOCKETS`: a translated socket (`bpf_get_socket_cookie`) and the backend it
/// talks to (a connected socket has one; an unconnected UDP socket one per backend it sent to).
/// An IPv4 backend is keyed as IPv4 even for an `AF_INET6` socket that reaches it mapped
/// (`::ffff:a.b.c.d`), so readers and the writer's settling know one form of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SocketKey {
    pub cookie: u64,
    pub backend: Backend,
    pub pad: u32,
}

/// Value of `SVC_SOCKETS`: the frontend the application addressed, to show it as the peer
/// (`getpeername`, `recvfrom`) and to connect a UDP socket again when its backend is removed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SocketService {
    pub frontend: ServiceKey,
}

/// What the socket LB did, by number: the index into `SVC_COUNTERS` (per CPU, `Counter`'s
/// `packets` counting events, `bytes` unused). Stable numbers: add events at the end.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceEvent {
    /// A `connect` (TCP, connected UDP) to a frontend was sent to a backend.
    Connect = 0,
    /// An unconnected UDP datagram to a frontend was sent to a backend.
    Sendmsg = 1,
    /// A datagram from a backend was shown to the application as from the frontend.
    Recvmsg = 2,
    /// `getpeername` showed the frontend instead of the backend.
    Getpeername = 3,
    /// A ClientIP Service's client got its previous backend again.
    AffinityHit = 4,
}

impl ServiceEvent {
    pub const ALL: [ServiceEvent; 5] =
        [Self::Connect, Self::Sendmsg, Self::Recvmsg, Self::Getpeername, Self::AffinityHit];

    /// Size of `SVC_COUNTERS`.
    pub const SLOTS: u32 = Self::ALL.len() as u32;

    pub const fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Sendmsg => "sendmsg",
            Self::Recvmsg => "recvmsg",
            Self::Getpeername => "getpeername",
            Self::AffinityHit => "affinity-hit",
        }
    }
}
