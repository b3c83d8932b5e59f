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

use crate::maps;

const WINDOW_NS: u64 = 1_000_000_000;

/// Value of `POLICY_BUDGETS`.
#[repr(C)]
pub struct Budget {
    pub window_start_ns: u64,
    /// New flows remembered in the window: ingress, egress.
    pub new_flows: [u32; 2],
}

/// Whether `owner`'s pod may have one more flow of `direction` remembered now; counts it if so.
#[inline(always)]
pub fn admit(owner: u64, direction: u8, now: u64) -> bool {
    let way = usize::from(direction == POLICY_DIRECTION_EGRESS);
    let Some(budget) = maps::POLICY_BUDGETS.get_ptr_mut(&owner) else {
        let mut fresh = Budget { window_start_ns: now, new_flows: [0; 2] };
        fresh.new_flows[way] = 1;
        // A concurrent insert wins, and this flow goes uncounted.
        let _ = maps::POLICY_BUDGETS.insert(&owner, &fresh, u64::from(BPF_NOEXIST));
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
