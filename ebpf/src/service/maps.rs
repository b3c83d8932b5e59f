//! The socket LB's maps (layouts and sizes in `ebpf-common/src/service.rs`), pinned with the
//! network's others. Written by the plugin's service writer, except `SVC_AFFINITY`,
//! `SVC_SOCKETS` and `SVC_COUNTERS`, which the programs keep.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
};
use ebpf_common::{
    Affinity, AffinityKey, Backend, BackendKey, Counter, FlowKey, IpKey, SVC_AFFINITY_MAX_ENTRIES,
    SVC_BACKENDS_MAX_ENTRIES, SVC_CLIENTS_MAX_ENTRIES, SVC_CT_MAX_ENTRIES, SVC_FRONTENDS_MAX_ENTRIES,
    SVC_SOCKETS_MAX_ENTRIES, Service, ServiceEvent, ServiceKey, SocketKey, SocketService, SvcClient, SvcCtEntry,
    SvcRejectBudget,
};

/// Not preallocated: a replaced element is freed after an RCU grace period, so a program
/// holding the old one while the writer switches banks still reads what it looked up (a
/// preallocated element can be reused at once), and memory follows the Services there are.
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

/// Service address, port, protocol → its backends' bank and count.
#[btf_map]
pub static SVC_FRONTENDS: HashMap<ServiceKey, Service, { SVC_FRONTENDS_MAX_ENTRIES as usize }, NO_PREALLOC> =
    HashMap::new();

/// (Service id, bank, index) → backend.
#[btf_map]
pub static SVC_BACKENDS: HashMap<BackendKey, Backend, { SVC_BACKENDS_MAX_ENTRIES as usize }, NO_PREALLOC> =
    HashMap::new();

/// ClientIP affinity: (client's network namespace, Service id) → its backend and last use. LRU.
#[btf_map]
pub static SVC_AFFINITY: LruHashMap<AffinityKey, Affinity, { SVC_AFFINITY_MAX_ENTRIES as usize }> = LruHashMap::new();

/// Translated sockets: (socket cookie, backend) → the frontend the application addressed. LRU.
#[btf_map]
pub static SVC_SOCKETS: LruHashMap<SocketKey, SocketService, { SVC_SOCKETS_MAX_ENTRIES as usize }> = LruHashMap::new();

/// Per-packet Service translations, both ways of each flow (`ct.rs`; layout in ebpf-common's
/// `service_ct.rs`). LRU: a full table forgets its least recently used flow.
#[btf_map]
pub static SVC_CT: LruHashMap<FlowKey, SvcCtEntry, { SVC_CT_MAX_ENTRIES as usize }> = LruHashMap::new();

/// Flows each client address opened in the current window (`share.rs`). LRU.
#[btf_map]
pub static SVC_CLIENTS: LruHashMap<IpKey, SvcClient, { SVC_CLIENTS_MAX_ENTRIES as usize }> = LruHashMap::new();

/// No-endpoint answers sent this second, per CPU (`reject.rs`).
#[btf_map]
pub static SVC_REJECTS: PerCpuArray<SvcRejectBudget, 1> = PerCpuArray::new();

/// The no-endpoint answers, programs of their own reached by a tail call (`reject.rs`,
/// `reject6.rs`): building a reply needs more stack than `svc_from_uplink6` has left, and a
/// tail call starts with a fresh one. Slot 0 `svc_reject`, 1 `svc_reject6`; filled by the
/// loader.
#[btf_map]
pub static SVC_REJECT_PROGS: ProgramArray<2> = ProgramArray::new();

/// Slots of `SVC_REJECT_PROGS`.
pub const REJECT_V4: u32 = 0;
pub const REJECT_V6: u32 = 1;

/// Events by `ServiceEvent`, per CPU (`packets` counts them).
#[btf_map]
pub static SVC_COUNTERS: PerCpuArray<Counter, { ServiceEvent::SLOTS as usize }> = PerCpuArray::new();

#[inline(always)]
pub fn count(event: ServiceEvent) {
    if let Some(counter) = SVC_COUNTERS.get_ptr_mut(event as u32) {
        // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
        unsafe { (*counter).packets += 1 };
    }
}
