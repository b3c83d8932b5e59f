/// Where a packet the programs let through went: the index into `FORWARDED`, which counts
/// packets and bytes per path (per CPU), so an operator sees how much traffic takes each fast
/// path and how much goes through the node's stack. Stable numbers: add paths at the end.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardPath {
    /// From a pod straight into another pod of this node (`bpf_redirect_peer`).
    PodToPod = 0,
    /// From a pod to another node, straight out of the uplink (the FIB redirect).
    ToOtherNode = 1,
    /// From a pod to the node's stack: the node's own addresses, Services, the outside (before
    /// masquerade), other nodes reached through another interface than the uplink, and what
    /// the FIB could not answer.
    ToStack = 2,
    /// Out of the uplink with the node's address (masquerade).
    Masqueraded = 3,
    /// A reply to a masqueraded flow, translated back and handed to the node's stack (whose
    /// conntrack saw the pod's side of the flow), which delivers it into the pod.
    ReplyToPod = 4,
    /// From the uplink (another node's pod) straight into a pod of this node.
    FromOtherNode = 5,
    /// From the uplink to a pod of this node through the stack: flows the stack handled the
    /// other direction of (a Service's remote endpoint), and flows opened from outside the cluster.
    UplinkToStack = 6,
    /// From a pod to a pod (here or on another node) through the stack rather than a fast path,
    /// because the stack handled the flow's other direction (a Service's DNAT).
    StackFlow = 7,
    /// Out of the uplink with the pod's own address: its replies to a flow opened from outside.
    NotMasqueraded = 8,
    /// Answered by the datapath itself, back into the pod: ARP requests and IPv6 neighbour
    /// solicitations for the pod's gateway (or any address but the pod's own).
    Answered = 9,
    /// From the uplink to a Service frontend (NodePort, LoadBalancer IP, externalIP) or its
    /// remote backend's reply, translated in BPF and sent on: into a local backend, out to
    /// another node's backend, or back to the client.
    ServiceTranslated = 10,
    /// A local backend's reply to a translated flow, leaving the uplink as the frontend.
    ServiceReply = 11,
}

impl ForwardPath {
    /// Every path, in number order.
    pub const ALL: [ForwardPath; 12] = [
        Self::PodToPod,
        Self::ToOtherNode,
        Self::ToStack,
        Self::Masqueraded,
        Self::ReplyToPod,
        Self::FromOtherNode,
        Self::UplinkToStack,
        Self::StackFlow,
        Self::NotMasqueraded,
        Self::Answered,
        Self::ServiceTranslated,
        Self::ServiceReply,
    ];

    /// Size of `FORWARDED`: one slot per path.
    pub const SLOTS: u32 = Self::ALL.len() as u32;

    pub const fn name(self) -> &'static str {
        match self {
            Self::PodToPod => "pod-to-pod",
            Self::ToOtherNode => "to-other-node",
            Self::ToStack => "to-stack",
            Self::Masqueraded => "masqueraded",
            Self::ReplyToPod => "reply-to-pod",
            Self::FromOtherNode => "from-other-node",
            Self::UplinkToStack => "uplink-to-stack",
            Self::StackFlow => "stack-flow",
            Self::NotMasqueraded => "not-masqueraded",
            Self::Answered => "answered",
            Self::ServiceTranslated => "service-translated",
            Self::ServiceReply => "service-reply",
        }
    }

    pub fn from_index(index: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|p| *p as u32 == index)
    }
}
