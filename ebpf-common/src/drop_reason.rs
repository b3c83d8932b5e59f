/// Why a packet was dropped. The number is the index into `METRICS` and is stable: add new
/// reasons at the end, never renumber (dashboards and `inspect counters` read them by number).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// A header was shorter than its type requires.
    Malformed = 1,
    /// The source address (IPv4, IPv6 global or link-local) is not an address of the pod behind
    /// this interface, or an IPv6 link-local or unspecified source is used beyond its link.
    SpoofedSource = 2,
    /// ARP sender address is not the address of the pod behind this interface.
    SpoofedArp = 3,
    /// Neither IPv4, IPv6 nor ARP (VLAN tags, LLDP and others are not allowed), or IPv6 in a
    /// network without IPv6 addresses.
    UnsupportedProtocol = 4,
    /// The redirect helper refused the target interface.
    RedirectFailed = 5,
    /// Masquerade found no free port for a new flow (all tries taken by live flows).
    NatPortsExhausted = 6,
    /// Masquerade cannot translate it: a later fragment whose first fragment was not seen, an
    /// ICMP type other than echo, or a protocol other than TCP, UDP and ICMP. Dropped rather
    /// than leaked with the pod's address.
    NatUntranslatable = 7,
    /// To an address of this node's pod subnet that is no pod's (the gateway address, the
    /// broadcast, an unassigned one), about to leave through the uplink: it never leaves the
    /// node, where upstream routers would send it back (a loop) and with a pod's source.
    NotAPod = 8,
    /// The pod opened as many masqueraded flows this minute as `masqPodFlowsPerMinute` allows.
    NatPodLimit = 9,
    /// An IPv6 neighbour advertisement for an address that is not the pod's, or with a MAC that
    /// is not the pod's: IPv6's `SpoofedArp`.
    SpoofedNeighbor = 10,
    /// From a pod to 127.0.0.0/8: the node's loopback services are not the pods'. Linux drops
    /// such packets by itself unless `route_localnet=1`, which kube-proxy sets for NodePorts on
    /// localhost; then a pod's crafted packet would reach whatever the node binds to 127.0.0.1.
    Loopback = 11,
    /// Arriving on the uplink with a source address of this node's pods (its pod subnet, or a
    /// local endpoint's address): only the node's own veths carry those. A LAN host forging one
    /// would be delivered straight into a pod by `bpf_redirect_peer`, past rp_filter and
    /// netfilter, as if a local pod had sent it.
    SpoofedUplinkSource = 12,
    /// The pod holds as many masqueraded flows as it may, in total or towards this destination
    /// (`NAT_SHARES`): its new flow gets no port, so the others keep theirs.
    NatPodShare = 13,
    /// A `connect` or UDP send to a Service with no endpoint (socket LB): refused at once with
    /// `ECONNREFUSED`, as kube-proxy's REJECT rule answers, rather than left to time out.
    /// Counted per refused call (`bytes` stays 0: no packet was built).
    ServiceNoEndpoint = 14,
    /// From the uplink to an `externalTrafficPolicy: Local` frontend on a node without a local
    /// endpoint: not forwarded, as kube-proxy drops it (the load balancer's health check sends
    /// clients elsewhere).
    ServiceNoLocalEndpoint = 15,
    /// A client address opened as many flows to external frontends in this window as
    /// `SVC_CLIENT_NEW_FLOWS` allows: its new flow creates no state (a SYN flood from one
    /// source fills no more of `SVC_CT`).
    ServiceClientShare = 16,
    /// A no-endpoint answer (RST, ICMP port unreachable) over this CPU's budget per second, or
    /// one that would be larger than its request: dropped instead, so the node cannot be used
    /// as a reflector.
    ServiceRejectLimited = 17,
    /// No free SNAT port towards a remote backend (all tries taken by live flows).
    ServicePortsExhausted = 18,
    /// A new flow no NetworkPolicy allows (into or out of a pod some policy isolates). Counted per
    /// policy in `POLICY_COUNTS` too.
    PolicyDenied = 19,
}

impl DropReason {
    /// Every reason, in number order.
    pub const ALL: [DropReason; 19] = [
        Self::Malformed,
        Self::SpoofedSource,
        Self::SpoofedArp,
        Self::UnsupportedProtocol,
        Self::RedirectFailed,
        Self::NatPortsExhausted,
        Self::NatUntranslatable,
        Self::NotAPod,
        Self::NatPodLimit,
        Self::SpoofedNeighbor,
        Self::Loopback,
        Self::SpoofedUplinkSource,
        Self::NatPodShare,
        Self::ServiceNoEndpoint,
        Self::ServiceNoLocalEndpoint,
        Self::ServiceClientShare,
        Self::ServiceRejectLimited,
        Self::ServicePortsExhausted,
        Self::PolicyDenied,
    ];

    /// Size of `METRICS`: one slot per reason, slot 0 unused.
    pub const SLOTS: u32 = Self::ALL.len() as u32 + 1;

    pub const fn name(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::SpoofedSource => "spoofed-source",
            Self::SpoofedArp => "spoofed-arp",
            Self::UnsupportedProtocol => "unsupported-protocol",
            Self::RedirectFailed => "redirect-failed",
            Self::NatPortsExhausted => "nat-ports-exhausted",
            Self::NatUntranslatable => "nat-untranslatable",
            Self::NotAPod => "not-a-pod",
            Self::NatPodLimit => "nat-pod-limit",
            Self::SpoofedNeighbor => "spoofed-neighbor",
            Self::Loopback => "loopback",
            Self::SpoofedUplinkSource => "spoofed-uplink-source",
            Self::NatPodShare => "nat-pod-share",
            Self::ServiceNoEndpoint => "service-no-endpoint",
            Self::ServiceNoLocalEndpoint => "service-no-local-endpoint",
            Self::ServiceClientShare => "service-client-share",
            Self::ServiceRejectLimited => "service-reject-limited",
            Self::ServicePortsExhausted => "service-ports-exhausted",
            Self::PolicyDenied => "policy-denied",
        }
    }

    pub fn from_index(index: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|r| *r as u32 == index)
    }
}
