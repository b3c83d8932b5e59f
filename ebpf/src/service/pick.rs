//! Which backend a connect or send to a frontend goes to: the client's previous one for a
//! ClientIP Service while it is still a backend and within the timeout, else one at random.
use aya_ebpf::{EbpfContext as _, helpers, programs::SockAddrContext};
use ebpf_common::{AffinityKey, Backend, SERVICE_AFFINITY, ServiceEvent, ServiceKey};

use super::{
    affinity::{remember, slot, still_sticky},
    maps::{SVC_BACKENDS, SVC_FRONTENDS, count},
};

pub enum Pick {
    /// Not a Service's address: left alone.
    NotAService,
    /// A Service without endpoints.
    NoEndpoint,
    To(Backend),
}

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
    if sticky && let Some((previous, _)) = still_sticky(&affinity_key, &service) {
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
