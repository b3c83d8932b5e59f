//! NetworkPolicy in BPF: the maps the agent compiles policies into, and the per-flow verdicts the
//! programs cache. The agent does the whole API (selectors, named ports, `ipBlock` with `except`);
//! the programs only look up numbers:
//!
//! - `POLICY_IDENTITIES` (LPM trie, [`IpKey`] with `prefix_len = 32 + address bits`): any address
//!   → its [`PolicyIdentity`]. A pod's address → the identity of its namespace, labels, named
//!   ports and the `ipBlock`s holding it; a CIDR boundary of some `ipBlock` → the identity of the
//!   blocks it is in; `0.0.0.0/0`, `::/0` → [`IDENTITY_WORLD`]; this node's addresses →
//!   [`IDENTITY_HOST`]. Addresses with the same identity are treated the same by every rule.
//! - `POLICY_ENDPOINTS` (array, slot = `host_veth_slot(host ifindex)`): a local pod as a policy
//!   subject ([`PolicyEndpoint`]): its identity and whether it is isolated for ingress/egress.
//!   A slot whose `ifindex`/`owner` differ from the pod's is not the pod's (stale): not isolated.
//! - `POLICY_ENDPOINTS_BY_IFINDEX` (hash, host ifindex → [`PolicyEndpoint`]): the pods whose
//!   slot another live pod holds (two ifindexes equal modulo the slots). Looked up only when a
//!   pod's slot holds another nonzero ifindex, so that such a pod is enforced too.
//! - `POLICY_RULES` (LPM trie, [`PolicyRuleKey`]): what an isolated subject allows. Looked up
//!   twice when a flow opens: with the peer's identity and with [`IDENTITY_ANY`].
//! - `POLICY_FLOWS` (LRU hash, [`crate::FlowKey`] of each direction → [`PolicyFlow`]): the cached
//!   verdict of an allowed flow, one entry per direction, so that each packet pays one lookup.
//! - `POLICY_COUNTS` (per-CPU array, slot → [`PolicyCount`]): flows allowed and denied per policy.
use crate::IpKey;

/// Not an identity: the wildcard peer of a rule ("from/to every address").
pub const IDENTITY_ANY: u32 = 0;
/// This node's own addresses (kubelet's probes): always allowed in, as Kubernetes expects.
pub const IDENTITY_HOST: u32 = 1;
/// An address outside every known pod and every `ipBlock` (the `/0` entries).
pub const IDENTITY_WORLD: u32 = 2;
/// The agent numbers identities from here up; below are reserved.
pub const IDENTITY_FIRST_ALLOCATED: u32 = 256;

/// Bits of `prefix_len` an [`IpKey`] in `POLICY_IDENTITIES` spends on its family and padding
/// before the address: a `/24` IPv4 block has `prefix_len` 32 + 24.
pub const IDENTITY_PREFIX_OFFSET: u32 = 32;

/// Value of `POLICY_IDENTITIES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyIdentity {
    pub identity: u32,
    pub pad: u32,
}

/// [`PolicyEndpoint::flags`]: some policy selects the pod for ingress: what no rule allows in is dropped.
pub const POLICY_INGRESS_ISOLATED: u32 = 1;
/// The same for egress.
pub const POLICY_EGRESS_ISOLATED: u32 = 2;

/// Value of `POLICY_ENDPOINTS`: a pod of this node as a policy subject. Written by the agent,
/// cleared by DEL and GC (by `ifindex` and `owner`, like `HOST_VETHS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyEndpoint {
    /// The pod's host veth: a slot whose `ifindex` differs is another pod's, or stale.
    pub ifindex: u32,
    /// [`POLICY_INGRESS_ISOLATED`], [`POLICY_EGRESS_ISOLATED`].
    pub flags: u32,
    /// `Endpoint::owner` of the pod (its attachment): a reused ifindex is not the same pod.
    pub owner: u64,
    /// The pod's own identity: the subject in `POLICY_RULES`.
    pub identity: u32,
    /// The `POLICY_COUNTS` slot a denied flow in (out) is counted on: one of the policies that
    /// isolate the pod that way (the first by namespace/name).
    pub ingress_slot: u32,
    pub egress_slot: u32,
    pub pad: u32,
}

/// `POLICY_ENDPOINTS` has [`crate::HOST_VETHS_SLOTS`] slots, indexed like `HOST_VETHS`.
///
/// Capacity of `POLICY_ENDPOINTS_BY_IFINDEX`: as many pods as the slots, every one of them in
/// a slot another holds (allocated when inserted: most nodes have a few, or none).
pub const POLICY_ENDPOINTS_BY_IFINDEX_MAX_ENTRIES: u32 = crate::HOST_VETHS_SLOTS;
pub const POLICY_DIRECTION_INGRESS: u8 = 0;
pub const POLICY_DIRECTION_EGRESS: u8 = 1;

/// Key data of `POLICY_RULES`, an LPM trie over these 12 bytes in order. Every rule matches
/// `subject`, `peer` and `direction` whole (72 bits); then:
/// - `prefix_len` 72: every protocol and port (a rule without `ports`, or ICMP);
/// - 80: this `protocol`, every port (a port entry without `port`);
/// - 80 + n: the first n bits of `port_be` (a range `port..=endPort` is split into prefixes);
/// - 96: one port.
///
/// `port_be` is the destination port in network byte order, so that its high bits come first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyRuleKey {
    pub subject: u32,
    /// The peer's identity, or [`IDENTITY_ANY`].
    pub peer: u32,
    /// [`POLICY_DIRECTION_INGRESS`] or [`POLICY_DIRECTION_EGRESS`].
    pub direction: u8,
    /// IP protocol number: 6 TCP, 17 UDP, 132 SCTP.
    pub protocol: u8,
    pub port_be: [u8; 2],
}

/// `prefix_len` of a rule over every protocol and port.
pub const POLICY_RULE_ANY_PROTOCOL_BITS: u32 = 72;
/// `prefix_len` of a rule over one protocol, every port.
pub const POLICY_RULE_ANY_PORT_BITS: u32 = 80;
/// `prefix_len` of a rule on one port.
pub const POLICY_RULE_FULL_BITS: u32 = 96;

/// Value of `POLICY_RULES`: the `POLICY_COUNTS` slot of the policy that allows (the first by
/// namespace/name when several do).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    pub slot: u32,
    pub pad: u32,
}

/// Value of `POLICY_FLOWS`: a flow some check allowed, cached under each direction's key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyFlow {
    /// `bpf_ktime_get_ns` of the last packet seen (written at most once a second).
    pub last_seen_ns: u64,
    /// The attachment (`Endpoint::owner`) whose policy created the entry: its share is bounded.
    pub owner: u64,
    /// `POLICY_COUNTS` slot of the allowing policy, for the monitor.
    pub slot: u32,
    /// `POLICY_FLOW_*` bits.
    pub flags: u32,
}

/// `POLICY_FLOWS` keys carry in `FlowKey::pad[0]` which end of the packet the check's pod
/// (the entry's `owner`) is: each pod's entries are its own, so that two pods of this node on
/// one flow keep theirs apart, and an entry of another owner (a deleted pod's, whose address a
/// new pod got) is no entry. The check's pod sends the packet (egress checks).
pub const POLICY_FLOW_KEY_SUBJECT_SENDS: u8 = 1;
/// The check's pod receives the packet (ingress checks).
pub const POLICY_FLOW_KEY_SUBJECT_RECEIVES: u8 = 2;
/// A flow between two pods of this node, both policy subjects: one entry per flow, keyed in
/// one orientation (the lower address and port first), whose `owner` is the two pods' owners
/// XORed. It says that both pods' checks allowed the flow (each pod's own entries say so too), so
/// that `from_pod` judges each later packet, the sender's egress and the receiver's ingress, with
/// one lookup. New beside layout v4's keys: programs that do not know it never look it up.
pub const POLICY_FLOW_KEY_PAIR: u8 = 3;

/// [`PolicyFlow::flags`]: this key is the direction of the flow's opener.
pub const POLICY_FLOW_ORIGINAL: u32 = 1;
/// TCP: a FIN or RST was seen; the entry then ages like conntrack's closing states.
pub const POLICY_FLOW_CLOSING: u32 = 2;

/// Value of `POLICY_COUNTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyCount {
    pub allowed_flows: u64,
    pub denied_flows: u64,
}

/// Slots of `POLICY_COUNTS`: the agent gives each policy one (slot 0: none, e.g. a flow allowed
/// from the node itself). 16 Ki × 16 bytes per CPU.
pub const POLICY_SLOTS: u32 = 16_384;
/// `POLICY_FLOWS` entries one pod may have written per second and direction (flows it opens;
/// flows opened to it), and at once (a token bucket): its share of the table is bounded, so
/// that one pod opening allowed flows without end cannot cycle the LRU and make it forget the
/// other pods' flows. A flow costs one entry between two subjects of this node (the pair
/// entry), two otherwise. A flow over the budget is judged and let through as any other, but
/// not remembered: each of its packets is judged again (TCP's replies by the reply rule); a
/// UDP flow's replies then need the other side's rules. At this rate one pod needs 8 s to
/// write a table's worth of entries both ways (the argument: the datapath's `budget.rs`).
pub const POLICY_NEW_ENTRIES_PER_SECOND: u32 = 16_384;

/// Capacity of `POLICY_FLOWS` (two entries per flow).
pub const POLICY_FLOWS_MAX_ENTRIES: u32 = 262_144;
/// Capacity of `POLICY_IDENTITIES`: every pod address of the cluster and every `ipBlock` boundary.
pub const POLICY_IDENTITIES_MAX_ENTRIES: u32 = 262_144;
/// Capacity of `POLICY_RULES`.
pub const POLICY_RULES_MAX_ENTRIES: u32 = 262_144;

/// An address as `POLICY_IDENTITIES` keys it: `prefix_bits` of the address (32 or 128 for one
/// address).
pub const fn identity_prefix_len(prefix_bits: u32) -> u32 {
    IDENTITY_PREFIX_OFFSET + prefix_bits
}

/// The same key type as `ENDPOINTS`, so a packet's address is looked up in both without copying.
pub type IdentityKey = IpKey;

/// [`PolicyFlow::flags`]: the opener's side allowed the flow (its egress, on this node), in the
/// entries of both directions. A packet out of the opener, or into it (a reply), needs it.
pub const POLICY_FLOW_OPENER_OK: u32 = 4;
/// The responder's side allowed the flow (its ingress, on this node): a packet into the
/// responder, or out of it (a reply), needs it.
pub const POLICY_FLOW_RESPONDER_OK: u32 = 8;
/// An ingress-isolated pod sent the flow's first packet to the node's stack (a Service address
/// kube-proxy translates, the outside): its replies, translated back by the stack, may come in
/// (`to_pod`). Not a verdict on the pod's egress: that is taken on the translated packet.
pub const POLICY_FLOW_VIA_STACK: u32 = 16;
