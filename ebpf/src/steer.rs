//! Which way a flow goes. The fast paths (`bpf_redirect_peer` into a pod, the FIB redirect to
//! another node) skip the node's netfilter; conntrack must see either every packet of a flow or
//! none, or kube-proxy's `--ctstate INVALID -j DROP` drops the rest and its DNAT is never undone.
//! So a flow takes a fast path only if the stack never handled it: where the stack hands a
//! packet on to a pod (`to_pod`) or to another node (`to_uplink`), the key its replies will have
//! is recorded in `FLOWS`; where a reply could take a fast path (`from_pod`, `from_uplink`), it
//! is looked up. Flows the stack never saw (plain pod ↔ pod) are never recorded: a pod gets its
//! lookups only once the stack has delivered it such a flow (`Endpoint::stack_replies`,
//! `stack_peers`), so pods that serve no Service pay nothing.
use aya_ebpf::{bindings::BPF_NOEXIST, programs::TcContext};
use ebpf_common::{FLOW_VIA_STACK, FlowEntry, FlowKey};

use crate::{flow::Flow, maps};

/// Records that packets keyed `key` (the replies of the packet in hand) belong to a flow with
/// `flag`. Written only when missing: the packets of a Service flow do not all write.
#[inline(always)]
pub fn record(key: &FlowKey, owner: u64, flag: u32) {
    if let Some(entry) = maps::FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value, valid while this program runs; a lost race only repeats a write.
        unsafe {
            if (*entry).flags & flag == 0 {
                (*entry).flags |= flag;
            }
        }
        return;
    }
    let entry = FlowEntry { owner, flags: flag, pad: 0 };
    // A concurrent insert of the same key wins; the LRU makes room when the map is full.
    let _ = maps::FLOWS.insert(key, &entry, u64::from(BPF_NOEXIST));
}

/// Whether a flow entry with `flag` exists for `key`.
#[inline(always)]
pub fn has(key: &FlowKey, flag: u32) -> bool {
    // SAFETY: the value is read at once.
    maps::FLOWS.get_ptr(key).is_some_and(|entry| unsafe { (*entry).flags } & flag != 0)
}

/// Whether the packet must go through the stack: its flow was recorded, or it has no ports to
/// tell its flow by (an ICMP error, a fragment, another protocol) and so might belong to one.
/// (All fragments alike: the stack reassembles a datagram only when it sees all of them.)
#[inline(always)]
pub fn via_stack(ctx: &TcContext) -> bool {
    match Flow::parse(ctx) {
        Ok(flow) if !flow.first_fragment => has(&flow.key(), FLOW_VIA_STACK),
        _ => true,
    }
}
