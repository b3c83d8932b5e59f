//! Which frontend a packet from the uplink addresses, and which backend a new flow gets. Only
//! frontends marked `SERVICE_EXTERNAL` are: a LoadBalancer ingress IP or externalIP by its own
//! address, a NodePort by the key form "any node address" (address all zero) when the packet
//! is to the node's address. A ClusterIP is the socket LB's alone.
use aya_ebpf::helpers::bpf_get_prandom_u32;
use ebpf_common::{Backend, BackendKey, FlowKey, SERVICE_EXTERNAL, Service, ServiceKey};

use super::maps::{SVC_BACKENDS, SVC_FRONTENDS};

/// The external frontend a packet (`flow`, as on the wire) addresses; `node` is the node's
/// address of the packet's family (zero when it has none).
#[inline(always)]
pub fn external(flow: &FlowKey, node: &[u8; 16]) -> Option<Service> {
    let mut key = ServiceKey { addr: flow.dst_addr, port: flow.dst_port, protocol: flow.protocol, family: flow.family };
    // SAFETY: copied at once; the writer replaces entries whole.
    if let Some(service) = unsafe { SVC_FRONTENDS.get(&key).copied() }
        && service.flags & SERVICE_EXTERNAL != 0
    {
        return Some(service);
    }
    if flow.dst_addr != *node || *node == [0; 16] {
        return None;
    }
    key.addr = [0; 16];
    // SAFETY: as above.
    let service = unsafe { SVC_FRONTENDS.get(&key).copied() }?;
    (service.flags & SERVICE_EXTERNAL != 0).then_some(service)
}

/// A backend at random (per-packet flows have no ClientIP affinity yet). `None` only when a
/// removal races this lookup, or for a backend of another family than `family`.
#[inline(always)]
pub fn pick(service: &Service, family: u8) -> Option<Backend> {
    if service.count == 0 {
        return None;
    }
    // SAFETY: a helper any program may call.
    let index = (unsafe { bpf_get_prandom_u32() } % u32::from(service.count)) as u16;
    let slot = BackendKey { service: service.id, index, bank: service.bank, pad: 0 };
    // SAFETY: copied at once.
    let backend = unsafe { SVC_BACKENDS.get(&slot).copied() }?;
    (backend.family == family).then_some(backend)
}
