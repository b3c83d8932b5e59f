//! A new flow to an external frontend, whatever its family: whether the packet may open one,
//! which backend it gets, with or without SNAT, and both `SVC_CT` entries written. The caller
//! (`nodeport.rs`, `nodeport6.rs`) rewrites and sends the packet, or answers for a frontend
//! without endpoint.
use ebpf_common::{
    DropReason, FAMILY_IPV4, FlowKey, IpKey, SERVICE_EXTERNAL_LOCAL, SVC_CT_FORWARD, Service, SvcCtEntry,
};

use super::{ct, frontend, share, snat_port};
use crate::{flow::PROTO_TCP, maps};

pub enum Opened {
    /// The flow's entries are written: its packets, this one first, are translated by them.
    Flow,
    /// Not a packet that opens a flow (a TCP segment other than a SYN): no state, untranslated.
    Pass,
    Drop(DropReason),
    /// The frontend has no endpoint: answer at once.
    Reject,
}

/// `key` is the packet as it arrived (client → frontend); `opens` whether it is a SYN without
/// ACK (TCP); `node` the node's address of its family, for SNAT.
#[inline(always)]
pub fn open(key: &FlowKey, opens: bool, service: &Service, node: [u8; 16]) -> Opened {
    if key.protocol == PROTO_TCP && !opens {
        return Opened::Pass;
    }
    let local_only = service.flags & SERVICE_EXTERNAL_LOCAL != 0;
    if service.count == 0 {
        return if local_only { Opened::Drop(DropReason::ServiceNoLocalEndpoint) } else { Opened::Reject };
    }
    if !share::admit(&ip_key(key.family, key.src_addr)) {
        return Opened::Drop(DropReason::ServiceClientShare);
    }
    let Some(backend) = frontend::pick(service, key) else { return Opened::Pass };
    let local = maps::ENDPOINTS.get_ptr(&ip_key(key.family, backend.addr)).is_some();
    if !local && local_only {
        return Opened::Drop(DropReason::ServiceNoLocalEndpoint);
    }
    let client = (key.src_addr, key.src_port);
    let front = (key.dst_addr, key.dst_port);
    let to = (backend.addr, backend.port);
    let src = if local {
        let reply_key = FlowKey {
            family: key.family,
            protocol: key.protocol,
            pad: [0; 2],
            src_port: to.1,
            dst_port: client.1,
            src_addr: to.0,
            dst_addr: client.0,
        };
        if !ct::claim_reply(&reply_key, front, client) {
            // A live flow of this client's address and port already reaches this backend
            // through another frontend.
            return Opened::Drop(DropReason::ServicePortsExhausted);
        }
        client
    } else {
        let Some(port) = snat_port::claim(key.protocol, key.family, node, to, front, client) else {
            return Opened::Drop(DropReason::ServicePortsExhausted);
        };
        (node, port)
    };
    match ct::open(key, &ct::Translation { src, dst: to }) {
        Some(_) => Opened::Flow,
        None => {
            let unwritten = SvcCtEntry {
                src_addr: src.0,
                dst_addr: to.0,
                src_port: src.1,
                dst_port: to.1,
                direction: SVC_CT_FORWARD,
                state: 0,
                pad: [0; 2],
                last_seen_ns: 0,
            };
            ct::release(&ct::other_way(&unwritten, key.protocol, key.family));
            Opened::Drop(DropReason::ServicePortsExhausted)
        }
    }
}

#[inline(always)]
fn ip_key(family: u8, addr: [u8; 16]) -> IpKey {
    if family == FAMILY_IPV4 { IpKey::v4([addr[0], addr[1], addr[2], addr[3]]) } else { IpKey::v6(addr) }
}
