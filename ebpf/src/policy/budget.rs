//! One pod's share of `POLICY_FLOWS`: at most `POLICY_NEW_FLOWS_PER_SECOND` new flows
//! remembered per second and direction (those it opens, those opened to it), counted per
//! owner. A rate, not a count of the entries a pod holds: the LRU forgets entries silently, so
//! a held count could only drift up (as `pod_flows.rs` explains for masquerading).
//!
//! Over the budget a flow is still judged and let through, only not remembered: each of its
//! packets pays the full check. Dropping it instead would turn a busy pod's allowed traffic
//! into drops; not remembering costs only the cache. Plain read-modify-writes: two CPUs
//! admitting one pod's flows in the same instant can lose a count (a little lenient).
use aya_ebpf::bindings::BPF_NOEXIST;
use ebpf_common::{POLICY_DIRECTION_EGRESS, POLICY_NEW_FLOWS_PER_SECOND};

use super::scratch::Scratch;
use crate::maps;

const WINDOW_NS: u64 = 1_000_000_000;

/// Value of `POLICY_BUDGETS`.
#[repr(C)]
pub struct Budget {
    pub window_start_ns: u64,
    /// New flows remembered in the window: ingress, egress.
    pub new_flows: [u32; 2],
}

/// Whether the subject of `s` may have one more flow of its direction remembered now; counts
/// it if so. The key and a new value are built in the scratch value (the stack is the callers').
#[inline(never)]
pub fn admit(s: &mut Scratch, now: u64) -> bool {
    let way = usize::from(s.direction == POLICY_DIRECTION_EGRESS);
    s.budget_owner = s.subject.owner;
    let Some(budget) = maps::POLICY_BUDGETS.get_ptr_mut(&s.budget_owner) else {
        s.budget = Budget { window_start_ns: now, new_flows: [0; 2] };
        s.budget.new_flows[way] = 1;
        // A concurrent insert wins, and this flow goes uncounted.
        let _ = maps::POLICY_BUDGETS.insert(&s.budget_owner, &s.budget, u64::from(BPF_NOEXIST));
        return true;
    };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        if now.saturating_sub((*budget).window_start_ns) >= WINDOW_NS {
            (*budget).window_start_ns = now;
            (*budget).new_flows = [0; 2];
        }
        let used = &mut (*budget).new_flows[way];
        if *used >= POLICY_NEW_FLOWS_PER_SECOND {
            return false;
        }
        *used += 1;
    }
    true
}
