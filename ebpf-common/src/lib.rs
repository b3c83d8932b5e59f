//! Types shared by the TC programs (`ebpf/`) and the plugin (`cni-plugin/`).
//!
//! Every type here is `#[repr(C)]` and is the key or value of a pinned, BTF-typed map, so
//! `bpftool map dump pinned …` prints these field names. Changing a layout means bumping
//! [`PIN_LAYOUT_VERSION`], because pins of the old layout stay in bpffs across upgrades.
#![no_std]

mod config;
mod drop_reason;
mod endpoint;
mod flows;
mod forward_path;
mod monitor;
mod nat;
mod policy;
mod service;
mod service_ct;
mod shares;

pub use config::DatapathConfig;
pub use drop_reason::DropReason;
pub use endpoint::{
    Counter, ENDPOINT_EGRESS_SHAPED, ENDPOINT_LINK_LOCAL, ENDPOINT_SHAPED, Endpoint, FAMILY_IPV4, FAMILY_IPV6,
    FloorTarget, HOST_VETHS_SLOTS, HostVeth, IpKey, host_veth_slot, ipv4_in_16,
};
pub use flows::*;
pub use forward_path::ForwardPath;
pub use monitor::*;
pub use nat::*;
pub use policy::*;
pub use service::*;
pub use service_ct::*;
pub use shares::*;

/// Version of the pinned map layout and program ABI; part of the pin path (`…/<network>/v<N>/`).
/// 4: `FRAGMENTS`' value grew, `Endpoint`'s two stack bytes became one `stack_epoch`, a new map.
pub const PIN_LAYOUT_VERSION: u32 = 4;

/// `FEATURES[0]` bit: the programs take a `NAT` or `FLOWS` entry for its owner's only (one
/// whose owner no longer holds the pod's address is ignored, and its port may be taken), so DEL
/// leaves a deleted pod's flows to age instead of scanning both maps under the node's lock.
/// The previous layout's programs as release 5b4a135 loaded them lack the bit (and the map):
/// for them DEL still purges.
pub const FEATURE_OWNER_CHECKS: u64 = 1;
/// `FEATURES[0]` bit: `from_pod` hands a pod flagged `ENDPOINT_EGRESS_SHAPED` to the node's
/// egress shaping (the IFB) instead of a fast path. An egress limit is refused (code 102) on a
/// datapath loaded without it: the previous layout's programs as 5b4a135 loaded them would skip
/// the limit for pod → pod and cross-node traffic, silently.
pub const FEATURE_EGRESS_SHAPING: u64 = 2;
/// `FEATURES[0]` bit: the programs mark pods with stack epochs (`STACK_EPOCH`,
/// `Endpoint::stack_epoch`), which the agent and GC renew and advance. Without it (the
/// previous layout's programs: one-byte flags that never clear) nothing is renewed.
pub const FEATURE_STACK_EPOCHS: u64 = 4;
/// `FEATURES[0]` bit: the programs find a sending pod in `HOST_VETHS` by its host veth's
/// ifindex first, and ADD, DEL, GC and the stack epochs' renewal keep that map. Pins of the
/// previous release lack the bit and the map: the plugin then leaves it alone.
pub const FEATURE_HOST_VETHS: u64 = 8;
/// `FEATURES[0]` bit: the programs enforce NetworkPolicy from the `POLICY_*` maps and write
/// `MONITOR_EVENTS` for a listening monitor. Pins of an older release lack the bit and the maps:
/// the agent then enforces nothing on that network (and says so) until its datapath is reloaded.
pub const FEATURE_POLICY: u64 = 16;

/// Capacity of `ENDPOINTS`: one entry per pod address on the node. 64 Ki entries of
/// 20 + 32 bytes cost about 5 MiB of kernel memory, far above kubelet's default of 110 pods.
pub const ENDPOINTS_MAX_ENTRIES: u32 = 65_536;

/// Names of the programs and maps as they appear in the object and in bpffs.
pub mod names {
    pub const FROM_POD: &str = "from_pod";
    pub const TO_UPLINK: &str = "to_uplink";
    pub const FROM_UPLINK: &str = "from_uplink";
    pub const TO_POD: &str = "to_pod";
    pub const TO_UPLINK6: &str = "to_uplink6";
    pub const FROM_UPLINK6: &str = "from_uplink6";
    pub const ENDPOINTS: &str = "ENDPOINTS";
    pub const METRICS: &str = "METRICS";
    pub const FORWARDED: &str = "FORWARDED";
    pub const NAT: &str = "NAT";
    pub const FLOWS: &str = "FLOWS";
    pub const FRAGMENTS: &str = "FRAGMENTS";
    pub const POD_FLOWS: &str = "POD_FLOWS";
    pub const SETTINGS: &str = "SETTINGS";
    pub const FEATURES: &str = "FEATURES";
    pub const NAT_SHARES: &str = "NAT_SHARES";
    pub const STACK_EPOCH: &str = "STACK_EPOCH";
    pub const HOST_VETHS: &str = "HOST_VETHS";
    pub const POLICY_IDENTITIES: &str = "POLICY_IDENTITIES";
    pub const POLICY_ENDPOINTS: &str = "POLICY_ENDPOINTS";
    pub const POLICY_ENDPOINTS_BY_IFINDEX: &str = "POLICY_ENDPOINTS_BY_IFINDEX";
    pub const POLICY_RULES: &str = "POLICY_RULES";
    pub const POLICY_FLOWS: &str = "POLICY_FLOWS";
    pub const POLICY_COUNTS: &str = "POLICY_COUNTS";
    pub const MONITOR_EVENTS: &str = "MONITOR_EVENTS";
    pub const MONITOR_CONTROL: &str = "MONITOR_CONTROL";
    pub const MONITOR_BUDGET: &str = "MONITOR_BUDGET";
    /// The benchmarks' reference program (`ebpf/src/floor.rs`): never loaded by the plugin.
    pub const FLOOR: &str = "floor";
    /// Its global, a [`crate::FloorTarget`].
    pub const FLOOR_TARGET: &str = "FLOOR_TARGET";
    pub const NODE_ECHOES: &str = "NODE_ECHOES";
    pub const SVC_FRONTENDS: &str = "SVC_FRONTENDS";
    pub const SVC_BACKENDS: &str = "SVC_BACKENDS";
    pub const SVC_AFFINITY: &str = "SVC_AFFINITY";
    pub const SVC_SOCKETS: &str = "SVC_SOCKETS";
    pub const SVC_COUNTERS: &str = "SVC_COUNTERS";
    pub const SVC_CT: &str = "SVC_CT";
    pub const SVC_CLIENTS: &str = "SVC_CLIENTS";
    pub const SVC_REJECTS: &str = "SVC_REJECTS";
    /// Per-packet Service translation on the uplink (`ebpf/src/service/`): the client's side
    /// in, the local backends' replies out; IPv4, then IPv6.
    pub const SVC_FROM_UPLINK: &str = "svc_from_uplink";
    pub const SVC_TO_UPLINK: &str = "svc_to_uplink";
    pub const SVC_FROM_UPLINK6: &str = "svc_from_uplink6";
    /// The no-endpoint answers, tail-called from the two above through `SVC_REJECT_PROGS`.
    pub const SVC_REJECT: &str = "svc_reject";
    pub const SVC_REJECT6: &str = "svc_reject6";
    pub const SVC_REJECT_PROGS: &str = "SVC_REJECT_PROGS";
    pub const SVC_TO_UPLINK6: &str = "svc_to_uplink6";
    /// The socket LB's programs (`cgroup/<hook>` sections), in attach order.
    pub const SOCKET_LB: [&str; 8] = [
        "svc_connect4",
        "svc_connect6",
        "svc_sendmsg4",
        "svc_sendmsg6",
        "svc_recvmsg4",
        "svc_recvmsg6",
        "svc_getpeername4",
        "svc_getpeername6",
    ];
    /// The global holding [`crate::DatapathConfig`].
    pub const CONFIG: &str = "CONFIG";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` data with explicit padding fields and no invariants.
    unsafe impl aya::Pod for crate::IpKey {}
    unsafe impl aya::Pod for crate::Endpoint {}
    unsafe impl aya::Pod for crate::HostVeth {}
    unsafe impl aya::Pod for crate::PolicyIdentity {}
    unsafe impl aya::Pod for crate::PolicyEndpoint {}
    unsafe impl aya::Pod for crate::PolicyRuleKey {}
    unsafe impl aya::Pod for crate::PolicyRule {}
    unsafe impl aya::Pod for crate::PolicyFlow {}
    unsafe impl aya::Pod for crate::PolicyCount {}
    unsafe impl aya::Pod for crate::MonitorEvent {}
    unsafe impl aya::Pod for crate::MonitorControl {}
    unsafe impl aya::Pod for crate::MonitorBudget {}
    unsafe impl aya::Pod for crate::FloorTarget {}
    unsafe impl aya::Pod for crate::Counter {}
    unsafe impl aya::Pod for crate::FlowKey {}
    unsafe impl aya::Pod for crate::NatEntry {}
    unsafe impl aya::Pod for crate::FlowEntry {}
    unsafe impl aya::Pod for crate::FragmentKey {}
    unsafe impl aya::Pod for crate::FragmentEntry {}
    unsafe impl aya::Pod for crate::PodFlows {}
    unsafe impl aya::Pod for crate::ShareKey {}
    unsafe impl aya::Pod for crate::Share {}
    unsafe impl aya::Pod for crate::DatapathConfig {}
    unsafe impl aya::Pod for crate::ServiceKey {}
    unsafe impl aya::Pod for crate::Service {}
    unsafe impl aya::Pod for crate::BackendKey {}
    unsafe impl aya::Pod for crate::Backend {}
    unsafe impl aya::Pod for crate::AffinityKey {}
    unsafe impl aya::Pod for crate::Affinity {}
    unsafe impl aya::Pod for crate::SocketKey {}
    unsafe impl aya::Pod for crate::SocketService {}
    unsafe impl aya::Pod for crate::SvcCtEntry {}
    unsafe impl aya::Pod for crate::SvcClient {}
    unsafe impl aya::Pod for crate::SvcRejectBudget {}
}
