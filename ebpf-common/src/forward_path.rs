/// Where a packet the programs let through went: the index into `FORWARDED`, which counts
/// packets and bytes per path (per CPU), so an operator sees how much traffic takes each fast
/// path and how much goes through the node's stack. Stable numbers: add paths at the end.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardPath {
    /// From a pod straight into another pod of this node (`bpf_redirect_peer`).
    PodToPod = 0,
    /// From a pod to another node, out of the interface the FIB chose.
    ToOtherNode = 1,
    /// From a pod to the node's stack: the node's own addresses, Services, the outside (before
    /// masquerade), and what the FIB could not answer.
    ToStack = 2,
    /// Out of the uplink with the node's address (masquerade).
    Masqueraded = 3,
    /// A reply to a masqueraded flow, translated back and delivered into its pod.
    ReplyToPod = 4,
}

impl ForwardPath {
    /// Every path, in number order.
    pub const ALL: [ForwardPath; 5] =
        [Self::PodToPod, Self::ToOtherNode, Self::ToStack, Self::Masqueraded, Self::ReplyToPod];

    /// Size of `FORWARDED`: one slot per path.
    pub const SLOTS: u32 = Self::ALL.len() as u32;

    pub const fn name(self) -> &'static str {
        match self {
            Self::PodToPod => "pod-to-pod",
            Self::ToOtherNode => "to-other-node",
            Self::ToStack => "to-stack",
            Self::Masqueraded => "masqueraded",
            Self::ReplyToPod => "reply-to-pod",
        }
    }

    pub fn from_index(index: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|p| *p as u32 == index)
    }
}
