//! Which pods need a look in `FLOWS` before a fast path: those the node's stack handed a flow
//! in this stack epoch or the last (`Endpoint::stack_epoch`; ebpf-common's `flows.rs` says how
//! the agent renews and advances epochs). A pod that once used a Service is back on the fast
//! path at no cost once its Service flows are gone.
use ebpf_common::{Endpoint, STACK_EPOCH_SLOT, host_veth_slot, stack_epoch_live};

use crate::maps;

/// The epoch the map holds; 0 before the first advance.
#[inline(always)]
fn current() -> u32 {
    // SAFETY: an array slot, copied out at once.
    maps::STACK_EPOCH.get(STACK_EPOCH_SLOT).copied().unwrap_or(0)
}

/// Whether `pod`'s flows need a look in `FLOWS`. Pods never marked pay no map lookup.
#[inline(always)]
pub fn live(pod: &Endpoint) -> bool {
    live_epoch(pod.stack_epoch)
}

/// [`live`] for a pod whose mark is `epoch` (a `HOST_VETHS` slot's, `sender.rs`).
#[inline(always)]
pub fn live_epoch(epoch: u32) -> bool {
    epoch != 0 && stack_epoch_live(epoch, current())
}

/// Marks `pod` as handed a flow by the stack now. Written only when it moves forward: most
/// packets of a Service flow find it marked already and leave the cache line alone.
///
/// # Safety
/// `pod` points at an `ENDPOINTS` value, valid while the program runs.
#[inline(always)]
pub unsafe fn mark(pod: *mut Endpoint) {
    let epoch = current() + 1;
    // SAFETY: by the caller; a race with another CPU or the agent writes an epoch at least as new.
    unsafe {
        if (*pod).stack_epoch < epoch {
            (*pod).stack_epoch = epoch;
        }
        // The pod's `HOST_VETHS` slot too, if it is the pod's (`from_pod` reads the sender's
        // mark there): by its own test, not only when the entry's moved, so that a slot never
        // lags. ADD writes the slot before the entries, so no mark comes before the slot is
        // the pod's.
        let ifindex = (*pod).host_ifindex;
        if let Some(slot) = maps::HOST_VETHS.get_ptr_mut(host_veth_slot(ifindex))
            && (*slot).ifindex == ifindex
            && (*slot).owner == (*pod).owner
            && (*slot).stack_epoch < epoch
        {
            (*slot).stack_epoch = epoch;
        }
    }
}
