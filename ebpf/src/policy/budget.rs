//! One pod's share of `POLICY_FLOWS`: the entries written for it are paid from a token bucket
//! per owner and direction (flows it opens; flows opened to it), of `POLICY_NEW_ENTRIES_PER_SECOND`
//! entries a second and as many at once. A rate, not a count of the entries a pod holds: the
//! LRU forgets entries silently, so a held count could only drift up (as `pod_flows.rs`
//! explains for masquerading).
//!
//! The rate, against the table: a flow between two subjects of this node costs one entry (its
//! pair entry, paid by the opener: `pair.rs`; nothing when its key is there already and is
//! written over in place), any other flow two (its subject's, each direction). A pod at full
//! tilt both ways writes at most 2 × 16,384 entries a second, so that alone it needs 8 s to
//! write as many entries as the table's 262,144 (7 s from two full buckets). The kernel's LRU
//! gives an entry looked up since its last pass another round, so a flow with a packet every
//! few seconds keeps its entry through one pod's churn; an idle one that is pushed out is
//! judged again on its next packet (TCP in its own direction or as a reply, UDP in its own
//! direction). And the rate is above what one pod opens when it opens connections as fast as
//! it can: one client thread, one connection at a time, makes ~15,000 pod → pod connections
//! a second on the bench's VM, each one entry. The earlier 1,000 flows a second per pod and
//! direction left 93 % of those flows unremembered, every packet of them judged in full
//! (bench/results/2026-11-28-policy.md: 0.93× the connections without policy).
//! Many pods churning at once are bounded only by their sum, as conntrack's table is.
//!
//! The bucket is GCRA's form: one time per direction, when the bucket is full again; an entry
//! moves it on by 1/rate, and none fits when it would lie more than a bucket ahead of now.
//! Any span of W seconds admits at most (1 + W) × 16,384 entries a direction.
//!
//! Over the budget a flow is still judged and let through, only not remembered: each of its
//! packets pays the full check. Dropping it instead would turn a busy pod's allowed traffic
//! into drops; not remembering costs only the cache. Plain read-modify-writes: two CPUs
//! admitting one pod's flows in the same instant can lose a count (a little lenient).
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_coarse_ns};
use ebpf_common::{POLICY_DIRECTION_EGRESS, POLICY_NEW_ENTRIES_PER_SECOND};

use super::scratch::Scratch;
use crate::maps;

/// What one entry moves the bucket's time on by.
const NS_PER_ENTRY: u64 = 1_000_000_000 / POLICY_NEW_ENTRIES_PER_SECOND as u64;
/// How far ahead of now the time may lie: a full bucket, a second's entries.
const BURST_NS: u64 = 1_000_000_000;

/// Value of `POLICY_BUDGETS` (not pinned: its layout is this build's).
#[repr(C)]
pub struct Budget {
    /// When each direction's bucket (ingress, egress) is full again.
    pub full_at_ns: [u64; 2],
}

/// Whether the pod of `s.budget_owner` may have `s.budget_entries` more entries written in
/// `s.budget_direction` now; pays for them if so. Asked and answered in the scratch value,
/// the clock read after the lookup: this frame takes no stack (the callers' leave none).
#[inline(never)]
pub fn admit(s: &mut Scratch) -> bool {
    let budget = maps::POLICY_BUDGETS.get_ptr_mut(&s.budget_owner);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let way = usize::from(s.budget_direction == POLICY_DIRECTION_EGRESS);
    let cost = u64::from(s.budget_entries) * NS_PER_ENTRY;
    let Some(budget) = budget else {
        s.budget = Budget { full_at_ns: [now; 2] };
        s.budget.full_at_ns[way] = now + cost;
        // A concurrent insert wins, and these entries go unpaid.
        let _ = maps::POLICY_BUDGETS.insert(&s.budget_owner, &s.budget, u64::from(BPF_NOEXIST));
        return true;
    };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        let full_at = &mut (*budget).full_at_ns[way];
        let after = if *full_at > now { *full_at } else { now } + cost;
        if after - now > BURST_NS {
            return false;
        }
        *full_at = after;
    }
    true
}
