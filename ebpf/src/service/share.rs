//! One client address's share of `SVC_CT`: at most `SVC_CLIENT_NEW_FLOWS` new flows per
//! window, so a SYN flood from one source (or a UDP spray over source ports) holds a bounded
//! part of the table while its NEW entries live, and cannot make the LRU evict other clients'.
use aya_ebpf::{bindings::BPF_ANY, helpers::bpf_ktime_get_ns};
use ebpf_common::{IpKey, SVC_CLIENT_NEW_FLOWS, SVC_CLIENT_WINDOW_NS, SvcClient};

use super::maps::SVC_CLIENTS;

/// Whether `client` may open one more flow now; counts it if so.
#[inline(always)]
pub fn admit(client: &IpKey) -> bool {
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(seen) = SVC_CLIENTS.get_ptr_mut(client) else {
        let first = SvcClient { window_start_ns: now, opened: 1, pad: 0 };
        // A full LRU forgets its oldest client, whose next window starts afresh: no harm.
        let _ = SVC_CLIENTS.insert(client, &first, u64::from(BPF_ANY));
        return true;
    };
    // SAFETY: an LRU value, valid while this program runs; a race between CPUs miscounts by
    // a few flows, never unbounded.
    unsafe {
        if now.wrapping_sub((*seen).window_start_ns) >= SVC_CLIENT_WINDOW_NS {
            (*seen).window_start_ns = now;
            (*seen).opened = 0;
        }
        if (*seen).opened >= SVC_CLIENT_NEW_FLOWS {
            return false;
        }
        (*seen).opened += 1;
    }
    true
}
