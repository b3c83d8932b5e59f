//! Maps shared with the plugin, all BTF-typed (`#[btf_map]`) so bpftool prints field names.
//! The plugin pins them per network; the sizes are documented on the constants in ebpf-common.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    macros::btf_map,
    programs::TcContext,
};
use ebpf_common::{
    Counter, DatapathConfig, DropReason, ENDPOINTS_MAX_ENTRIES, Endpoint, FLOWS_MAX_ENTRIES, FRAGMENTS_MAX_ENTRIES,
    FlowEntry, FlowKey, ForwardPath, FragmentEntry, FragmentKey, HOST_VETHS_SLOTS, HostVeth, IpKey, NAT_MAX_ENTRIES,
    NAT_SHARES_MAX_ENTRIES, NODE_ECHOES_MAX_ENTRIES, NatEntry, POD_FLOWS_MAX_ENTRIES,
    POLICY_ENDPOINTS_BY_IFINDEX_MAX_ENTRIES, POLICY_FLOWS_MAX_ENTRIES, POLICY_IDENTITIES_MAX_ENTRIES,
    POLICY_RULES_MAX_ENTRIES, POLICY_SLOTS, PodFlows, PolicyCount, PolicyEndpoint, PolicyFlow, PolicyIdentity,
    PolicyRule, PolicyRuleKey, Share, ShareKey,
};

/// Hash maps whose entries are allocated when inserted: creating a preallocated map of 65,536
/// entries took ~2 ms of a network's first ADD, and these see few inserts (ENDPOINTS: the
/// plugin's, once per pod address; POD_FLOWS: the datapath's, once per masquerading pod).
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// Pod address → its interface on this node. Written by the plugin on ADD, removed on DEL.
#[btf_map]
pub static ENDPOINTS: HashMap<IpKey, Endpoint, { ENDPOINTS_MAX_ENTRIES as usize }, NO_PREALLOC> = HashMap::new();

/// Host veth ifindex (modulo the size) → the pod behind it: `from_pod`'s first look for the
/// sender (`sender.rs`), an array slot the verifier turns into an address computation, where an
/// `ENDPOINTS` lookup hashes a 20-byte key. Written by the plugin on ADD, cleared on DEL and GC;
/// the size and the slot's rules are on `HOST_VETHS_SLOTS` in ebpf-common.
#[btf_map]
pub static HOST_VETHS: Array<HostVeth, { HOST_VETHS_SLOTS as usize }> = Array::new();

/// Masqueraded flows, both directions (see `snat.rs`, `rev_snat.rs`). LRU: a full map forgets the oldest flow.
#[btf_map]
pub static NAT: LruHashMap<FlowKey, NatEntry, { NAT_MAX_ENTRIES as usize }> = LruHashMap::new();

/// Fragmented masqueraded datagrams, both ways (see `fragments.rs`). LRU.
#[btf_map]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentEntry, { FRAGMENTS_MAX_ENTRIES as usize }> = LruHashMap::new();

/// The node's own echo requests, keyed like a masqueraded echo's reply (`node_echoes.rs`) →
/// when the last left. LRU.
#[btf_map]
pub static NODE_ECHOES: LruHashMap<FlowKey, u64, { NODE_ECHOES_MAX_ENTRIES as usize }> = LruHashMap::new();

/// New masqueraded flows per pod in the current minute, by owner (see `pod_flows.rs`).
#[btf_map]
pub static POD_FLOWS: HashMap<u64, PodFlows, { POD_FLOWS_MAX_ENTRIES as usize }, NO_PREALLOC> = HashMap::new();

/// Masqueraded flows each pod holds, in total and per destination (see `shares.rs`). LRU.
#[btf_map]
pub static NAT_SHARES: LruHashMap<ShareKey, Share, { NAT_SHARES_MAX_ENTRIES as usize }> = LruHashMap::new();

/// Scratch room for the two `NAT_SHARES` keys of a new flow (`shares.rs`), per CPU.
#[btf_map]
pub static SHARE_KEYS: PerCpuArray<ShareKey, 2> = PerCpuArray::new();

/// Flows the node's stack handled, keyed by their replies (see `steer.rs`). LRU.
#[btf_map]
pub static FLOWS: LruHashMap<FlowKey, FlowEntry, { FLOWS_MAX_ENTRIES as usize }> = LruHashMap::new();

/// A copy of the `CONFIG` global the programs were loaded with, written once by the plugin.
/// The programs read the global; this is for people (`bpftool map dump`) and for later ADDs,
/// which refuse a configuration that differs from what is loaded.
#[btf_map]
pub static SETTINGS: Array<DatapathConfig, 1> = Array::new();

/// The stack epoch in slot 0 (see `stack_epoch.rs`), advanced by the agent and GC.
#[btf_map]
pub static STACK_EPOCH: Array<u32, 1> = Array::new();

/// What the loaded programs do beyond their layout (`FEATURE_*` bits in slot 0), written once by
/// the plugin when it loads them and never read here: the control plane adapts to it.
#[btf_map]
pub static FEATURES: Array<u64, 1> = Array::new();

/// Drop counters indexed by `DropReason`, per CPU so that counting never contends.
#[btf_map]
pub static METRICS: PerCpuArray<Counter, { DropReason::SLOTS as usize }> = PerCpuArray::new();

/// Packets let through, by the path they took (`ForwardPath`), per CPU.
#[btf_map]
pub static FORWARDED: PerCpuArray<Counter, { ForwardPath::SLOTS as usize }> = PerCpuArray::new();

/// NetworkPolicy (`policy/`, ebpf-common's `policy.rs`): any address → its identity, longest
/// prefix. Written by the agent.
#[btf_map]
pub static POLICY_IDENTITIES: LpmTrie<IpKey, PolicyIdentity, { POLICY_IDENTITIES_MAX_ENTRIES as usize }> =
    LpmTrie::new();

/// Each local pod as a policy subject, slot by its host veth as in `HOST_VETHS`. Written by the
/// agent, cleared by DEL and GC.
#[btf_map]
pub static POLICY_ENDPOINTS: Array<PolicyEndpoint, { HOST_VETHS_SLOTS as usize }> = Array::new();

/// The pods whose `POLICY_ENDPOINTS` slot another live pod holds, by host ifindex (`policy/
/// subject.rs`). Written by the agent, cleared by DEL and GC; allocated when inserted.
#[btf_map]
pub static POLICY_ENDPOINTS_BY_IFINDEX: HashMap<
    u32,
    PolicyEndpoint,
    { POLICY_ENDPOINTS_BY_IFINDEX_MAX_ENTRIES as usize },
    NO_PREALLOC,
> = HashMap::new();

/// What isolated subjects allow (longest prefix over protocol and port). Written by the agent.
#[btf_map]
pub static POLICY_RULES: LpmTrie<PolicyRuleKey, PolicyRule, { POLICY_RULES_MAX_ENTRIES as usize }> = LpmTrie::new();

/// Verdicts of allowed flows, each direction (`policy/flows.rs`). LRU, written here only.
#[btf_map]
pub static POLICY_FLOWS: LruHashMap<FlowKey, PolicyFlow, { POLICY_FLOWS_MAX_ENTRIES as usize }> = LruHashMap::new();

/// The policy check's working memory (`policy/scratch.rs`), per CPU. Not pinned: nothing
/// outside this program run reads it.
#[btf_map]
pub static POLICY_SCRATCH: PerCpuArray<crate::policy::scratch::Scratch, 1> = PerCpuArray::new();

/// Each pod's new `POLICY_FLOWS` entries in the current second (`policy/budget.rs`), by owner.
/// LRU: a deleted pod's entry is forgotten in time. Not pinned: a reload starting the counts
/// again costs nothing.
#[btf_map]
pub static POLICY_BUDGETS: LruHashMap<u64, crate::policy::budget::Budget, { HOST_VETHS_SLOTS as usize * 2 }> =
    LruHashMap::new();

/// Flows allowed and denied per policy slot, per CPU.
#[btf_map]
pub static POLICY_COUNTS: PerCpuArray<PolicyCount, { POLICY_SLOTS as usize }> = PerCpuArray::new();

#[inline(always)]
pub fn endpoint(key: &IpKey) -> Option<Endpoint> {
    // SAFETY: the value is copied out at once; the plugin replaces entries whole.
    unsafe { ENDPOINTS.get(key).copied() }
}

/// Counts the drop and returns the verdict that drops the packet. With the network's
/// `ebpfLogLevel` at `debug` or more it is also logged (read with `ebpf-cni inspect logs`);
/// at the default, off, the verifier removes the logging code as dead.
#[inline(always)]
pub fn drop(ctx: &TcContext, reason: DropReason) -> i32 {
    aya_log_ebpf::debug!(ctx, "drop: {} ({}), {} bytes", reason.name(), reason as u32, ctx.len());
    if let Some(counter) = METRICS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(ctx.len());
        }
    }
    aya_ebpf::bindings::TC_ACT_SHOT as i32
}

/// Counts a packet on `path` and returns `verdict`, so a forward reads as one expression.
#[inline(always)]
pub fn forwarded(ctx: &TcContext, path: ForwardPath, verdict: i32) -> i32 {
    if let Some(counter) = FORWARDED.get_ptr_mut(path as u32) {
        // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(ctx.len());
        }
    }
    verdict
}

/// Counts an event that is no packet (a refused connect): `packets` counts it, `bytes` stays.
#[inline(always)]
pub fn count_drop_event(reason: DropReason) {
    if let Some(counter) = METRICS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
        unsafe { (*counter).packets += 1 };
    }
}
