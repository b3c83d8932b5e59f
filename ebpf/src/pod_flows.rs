//! How many masqueraded flows each pod holds (`POD_FLOWS`), for `masqFlowsPerPod`: one pod that
//! opens flows without end must not take the whole `NAT` table (an LRU: the others' live flows
//! would be forgotten) nor a destination's whole port range.
//!
//! Plain read-modify-writes: the BPF target has no atomic add in Rust's `core`, and two CPUs
//! allocating for one pod in the same instant can lose one change. The count is a limit's
//! guide, not a ledger; it never goes below zero, and DEL resets it.
use aya_ebpf::bindings::BPF_NOEXIST;

use crate::maps;

/// The pod's counter, created at zero on its first masqueraded flow.
#[inline(always)]
pub fn counter(owner: u64) -> Option<*mut u64> {
    if let Some(count) = maps::POD_FLOWS.get_ptr_mut(&owner) {
        return Some(count);
    }
    // A concurrent insert wins; either way the entry is there after.
    let _ = maps::POD_FLOWS.insert(&owner, &0u64, u64::from(BPF_NOEXIST));
    maps::POD_FLOWS.get_ptr_mut(&owner)
}

#[inline(always)]
pub fn read(count: *mut u64) -> u64 {
    // SAFETY: a map value, valid while this program runs.
    unsafe { *count }
}

#[inline(always)]
pub fn add(count: *mut u64) {
    // SAFETY: as above.
    unsafe { *count += 1 };
}

/// One flow of `owner`'s fewer (it closed, or its idle port went to another flow).
#[inline(always)]
pub fn release(owner: u64) {
    let Some(count) = maps::POD_FLOWS.get_ptr_mut(&owner) else { return };
    // SAFETY: as above.
    unsafe { *count = (*count).saturating_sub(1) };
}
