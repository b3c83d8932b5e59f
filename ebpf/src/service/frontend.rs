//! Which frontend a packet from the uplink addresses, and which backend a new flow gets. Only
//! frontends marked `SERVICE_EXTERNAL` are: a LoadBalancer ingress IP or externalIP by its own
//! address, a NodePort by the key form "any node address" (address all zero) when the packet
//! is to the node's address. A ClusterIP is the socket LB's alone.
use aya_ebpf::helpers::bpf_get_prandom_u32;
use ebpf_common::{
    Backend, BackendKey, FlowKey, SERVICE_AFFINITY, SERVICE_EXTERNAL, SVC_SNAT_PORT_MIN, Service, ServiceKey,
};

use super::{
    lan_affinity,
    maps::{SVC_BACKENDS, SVC_FRONTENDS},
};

/// What a packet from the LAN addresses, decided with one lookup: an external frontend, or,
/// to the node's address on a port of our SNAT range, possibly a remote backend's reply
/// (`SVC_CT` says), or neither: the verdict for every other packet (traffic to the node's own
/// sockets, other nodes' pods' traffic to this node's), which goes on at once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Addressed {
    Frontend,
    SnatReply,
    Neither,
}

/// What `flow` (as on the wire) addresses; `node` is the node's address of the packet's family
/// (zero when it has none). A flow whose frontend is gone is no longer translated: its next
/// packet goes to the node's stack, which answers as for any closed port.
#[inline(always)]
pub fn addressed(flow: &FlowKey, node: &[u8; 16]) -> Addressed {
    if external(flow, node).is_some() {
        Addressed::Frontend
    } else if *node != [0; 16] && flow.dst_addr == *node && flow.dst_port >= SVC_SNAT_PORT_MIN {
        Addressed::SnatReply
    } else {
        Addressed::Neither
    }
}

/// The external frontend a packet (`flow`, as on the wire) addresses; `node` is the node's
/// address of the packet's family (zero when it has none). To the node's address only
/// NodePorts (the key form "any node address") are looked up: the agent refuses a
/// LoadBalancer IP or externalIP that is one of the node's addresses.
#[inline(always)]
pub fn external(flow: &FlowKey, node: &[u8; 16]) -> Option<Service> {
    let to_node = *node != [0; 16] && flow.dst_addr == *node;
    let addr = if to_node { [0; 16] } else { flow.dst_addr };
    let key = ServiceKey { addr, port: flow.dst_port, protocol: flow.protocol, family: flow.family };
    // SAFETY: copied at once; the writer replaces entries whole.
    let service = unsafe { SVC_FRONTENDS.get(&key).copied() }?;
    (service.flags & SERVICE_EXTERNAL != 0).then_some(service)
}

/// The backend for a new flow (`flow`, as on the wire): for a ClientIP Service its client's
/// previous one (`lan_affinity.rs`), else one at random. `None` only when a removal races this
/// lookup, or for a backend of another family than the flow's.
#[inline(always)]
pub fn pick(service: &Service, flow: &FlowKey) -> Option<Backend> {
    if service.count == 0 {
        return None;
    }
    // Only a ClientIP Service pays for the affinity lookup.
    let previous = if service.flags & SERVICE_AFFINITY != 0 { lan_affinity::previous(flow, service) } else { None };
    // SAFETY: a helper any program may call.
    let index = previous.unwrap_or_else(|| (unsafe { bpf_get_prandom_u32() } % u32::from(service.count)) as u16);
    let slot = BackendKey { service: service.id, index, bank: service.bank, pad: 0 };
    // SAFETY: copied at once.
    let backend = unsafe { SVC_BACKENDS.get(&slot).copied() }?;
    (backend.family == flow.family).then_some(backend)
}
