//! How fast each pod opens masqueraded flows (`POD_FLOWS`), for `masqPodFlowsPerMinute`: one pod
//! opening flows without end must not churn the `NAT` table (an LRU: the other pods' idle but
//! live flows would be forgotten) nor fill a destination's port range.
//!
//! A rate, counted in windows of a minute, rather than a count of the flows a pod holds: flows
//! end silently (UDP, an LRU eviction), so a held count could only drift up and lock a pod out;
//! a window's count starts again from zero. Plain read-modify-writes: the BPF target has no
//! atomic add in Rust's `core`, and two CPUs admitting one pod's flows in the same instant can
//! lose a count, which only makes the limit a little lenient.
use aya_ebpf::bindings::BPF_NOEXIST;
use ebpf_common::{POD_FLOWS_WINDOW_NS, PodFlows};

use crate::maps;

/// Whether `owner`'s pod may open one more masqueraded flow now; counts it if so.
#[inline(always)]
pub fn admit(owner: u64, now: u64, per_minute: u32) -> bool {
    if per_minute == 0 {
        return true;
    }
    let Some(window) = maps::POD_FLOWS.get_ptr_mut(&owner) else {
        // A concurrent insert wins, and this flow goes uncounted.
        let _ =
            maps::POD_FLOWS.insert(&owner, &PodFlows { window_start_ns: now, new_flows: 1 }, u64::from(BPF_NOEXIST));
        return true;
    };
    // SAFETY: a hash map value, valid while this program runs.
    unsafe {
        if now.saturating_sub((*window).window_start_ns) >= POD_FLOWS_WINDOW_NS {
            *window = PodFlows { window_start_ns: now, new_flows: 0 };
        }
        if (*window).new_flows >= u64::from(per_minute) {
            return false;
        }
        (*window).new_flows += 1;
    }
    true
}
