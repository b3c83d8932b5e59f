//! The node's port for a flow sent to a backend on another node (externalTrafficPolicy
//! Cluster): the backend answers the node, whose `svc_from_uplink` finds the flow by that port.
//! Ports come from `SVC_SNAT_PORT_MIN..=SVC_SNAT_PORT_MAX`, a range no masquerade, NodePort or
//! default ephemeral port uses, so no socket of the node nor a masqueraded flow holds one; the
//! reply entry's `BPF_NOEXIST` insert is the claim.
use aya_ebpf::helpers::bpf_get_prandom_u32;
use ebpf_common::{FlowKey, SVC_SNAT_PORT_MAX, SVC_SNAT_PORT_MIN};

use super::ct;

/// Random tries before the flow is refused (`service-ports-exhausted`): with 4,536 ports per
/// backend, eight taken in a row means the backend's range is nearly full.
const TRIES: u32 = 8;

/// Claims a port of `node` towards `backend` for the flow `client` opened to `frontend`;
/// returns it, with its reply entry written.
#[inline(always)]
pub fn claim(
    protocol: u8,
    family: u8,
    node: [u8; 16],
    backend: ([u8; 16], u16),
    frontend: ([u8; 16], u16),
    client: ([u8; 16], u16),
) -> Option<u16> {
    let span = u32::from(SVC_SNAT_PORT_MAX - SVC_SNAT_PORT_MIN) + 1;
    let mut key = FlowKey {
        family,
        protocol,
        pad: [0; 2],
        src_port: backend.1,
        dst_port: 0,
        src_addr: backend.0,
        dst_addr: node,
    };
    for _ in 0..TRIES {
        // SAFETY: a helper any program may call.
        let port = SVC_SNAT_PORT_MIN + (unsafe { bpf_get_prandom_u32() } % span) as u16;
        key.dst_port = port;
        if ct::claim_reply(&key, frontend, client) {
            return Some(port);
        }
    }
    None
}
