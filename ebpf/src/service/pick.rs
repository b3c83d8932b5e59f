//! Which backend a connect or send to a frontend goes to: the client's previous one for a
//! ClientIP Service while it is still a backend and within the timeout, else one at random.
use aya_ebpf::{EbpfContext as _, helpers, programs::SockAddrContext};
use ebpf_common::{Affinity, AffinityKey, Backend, BackendKey, SERVICE_AFFINITY, Service, ServiceEvent, ServiceKey};

use super::maps::{SVC_AFFINITY, SVC_BACKENDS, SVC_FRONTENDS, count};

pub enum Pick {
    /// Not a Service's address: left alone.
    NotAService,
    /// A Service without endpoints.
    NoEndpoint,
    To(Backend),
}

/// How many of a ClientIP Service's backends are searched for the client's previous one (a
/// bounded loop for the verifier). Beyond it the client gets a new backend.
const AFFINITY_SCAN: u16 = 64;

#[inline(always)]
pub fn pick(ctx: &SockAddrContext, key: &ServiceKey) -> Pick {
    // SAFETY: copied at once; the writer replaces entries whole (see ebpf-common's service.rs).
    let Some(service) = (unsafe { SVC_FRONTENDS.get(key).copied() }) else { return Pick::NotAService };
    if service.count == 0 {
        return Pick::NoEndpoint;
    }
    let sticky = service.flags & SERVICE_AFFINITY != 0;
    // SAFETY: a helper the sock_addr programs may call with their context.
    let affinity_key = AffinityKey {
        netns_cookie: unsafe { helpers::bpf_get_netns_cookie(ctx.as_ptr()) },
        service: service.id,
        pad: 0,
    };
    if sticky && let Some(previous) = still_sticky(&affinity_key, &service) {
        count(ServiceEvent::AffinityHit);
        remember(&affinity_key, &previous);
        return Pick::To(previous);
    }
    // SAFETY: a helper any program may call.
    let index = (unsafe { helpers::bpf_get_prandom_u32() } % u32::from(service.count)) as u16;
    // SAFETY: copied at once.
    let Some(backend) = (unsafe { SVC_BACKENDS.get(slot(&service, index)).copied() }) else {
        // Only a removal racing this lookup leaves a slot missing: the Service is going away.
        return Pick::NoEndpoint;
    };
    if sticky {
        remember(&affinity_key, &backend);
    }
    Pick::To(backend)
}

#[inline(always)]
fn slot(service: &Service, index: u16) -> BackendKey {
    BackendKey { service: service.id, index, bank: service.bank, pad: 0 }
}

/// The client's previous backend, if within the timeout and still one of the Service's.
#[inline(always)]
fn still_sticky(key: &AffinityKey, service: &Service) -> Option<Backend> {
    // SAFETY: copied at once.
    let previous = unsafe { SVC_AFFINITY.get(key).copied() }?;
    let now = unsafe { helpers::bpf_ktime_get_ns() };
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
            return Some(backend);
        }
    }
    None
}

#[inline(always)]
fn remember(key: &AffinityKey, backend: &Backend) {
    let last_ns = unsafe { helpers::bpf_ktime_get_ns() };
    // A full LRU forgets its oldest client: that client gets a new backend next time.
    let _ = SVC_AFFINITY.insert(key, Affinity { backend: *backend, pad: 0, last_ns }, 0);
}
