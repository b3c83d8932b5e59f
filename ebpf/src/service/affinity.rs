//! `SVC_AFFINITY`, ClientIP affinity for both kinds of client: a local socket's network
//! namespace (`pick.rs`) and a LAN client's address (`lan_affinity.rs`). An entry is honoured
//! only within its Service's timeout and while its backend is still one of the Service's: the
//! LRU forgets entries of clients gone quiet, the read ignores stale ones before it does.
use aya_ebpf::helpers::bpf_ktime_get_ns;
use ebpf_common::{Affinity, AffinityKey, Backend, BackendKey, Service};

use super::maps::{SVC_AFFINITY, SVC_BACKENDS};

/// How many of a ClientIP Service's backends are searched for the client's previous one (a
/// bounded loop for the verifier). Beyond it the client gets a new backend.
const AFFINITY_SCAN: u16 = 64;

/// Slot `index` of the Service's current bank.
#[inline(always)]
pub fn slot(service: &Service, index: u16) -> BackendKey {
    BackendKey { service: service.id, index, bank: service.bank, pad: 0 }
}

/// The client's previous backend and its slot, if within the timeout and still one of the
/// Service's.
#[inline(always)]
pub fn still_sticky(key: &AffinityKey, service: &Service) -> Option<(Backend, u16)> {
    // SAFETY: copied at once.
    let previous = unsafe { SVC_AFFINITY.get(key).copied() }?;
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(previous.last_ns) > u64::from(service.affinity_timeout_s) * 1_000_000_000 {
        return None;
    }
    for index in 0..AFFINITY_SCAN {
        if index >= service.count {
            break;
        }
        // SAFETY: copied at once.
        let backend = unsafe { SVC_BACKENDS.get(slot(service, index)).copied() }?;
        if backend == previous.backend {
            return Some((backend, index));
        }
    }
    None
}

/// Records (or refreshes) the client's backend as of now.
#[inline(always)]
pub fn remember(key: &AffinityKey, backend: &Backend) {
    // SAFETY: a helper any program may call.
    let last_ns = unsafe { bpf_ktime_get_ns() };
    // A full LRU forgets its oldest client: that client gets a new backend next time.
    let _ = SVC_AFFINITY.insert(key, Affinity { backend: *backend, pad: 0, last_ns }, 0);
}
