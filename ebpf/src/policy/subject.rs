//! The pod a check is for: its `POLICY_ENDPOINTS` slot, found like its `HOST_VETHS` slot from
//! its host veth's ifindex. A slot of another veth or another attachment (a deleted pod's, not
//! yet rewritten) is not the pod's: not isolated. A pod in no policy's scope has flags 0 and
//! pays this one array read, which the verifier turns into an address computation.
use ebpf_common::{POLICY_EGRESS_ISOLATED, POLICY_INGRESS_ISOLATED, PolicyEndpoint, host_veth_slot};

use crate::maps;

/// A pod some policy isolates in at least one direction: its flows are tracked both ways, so
/// that the replies of what it opens (or accepts) pass the direction that is isolated.
/// The slot itself, not a copy: `from_pod`'s frame and the check's share 512 bytes of stack.
#[derive(Clone, Copy)]
pub struct Subject {
    pub endpoint: &'static PolicyEndpoint,
}

impl Subject {
    #[inline(always)]
    pub fn isolated(&self, direction: u8) -> bool {
        let bit = if direction == ebpf_common::POLICY_DIRECTION_INGRESS {
            POLICY_INGRESS_ISOLATED
        } else {
            POLICY_EGRESS_ISOLATED
        };
        self.endpoint.flags & bit != 0
    }

    /// The `POLICY_COUNTS` slot a denied flow that way is counted on.
    #[inline(always)]
    pub fn denied_slot(&self, direction: u8) -> u32 {
        if direction == ebpf_common::POLICY_DIRECTION_INGRESS {
            self.endpoint.ingress_slot
        } else {
            self.endpoint.egress_slot
        }
    }
}

/// The pod behind host veth `ifindex`, if some policy isolates it. `owner`, when known (the
/// `ENDPOINTS` entry's), must be the slot's too.
#[inline(always)]
pub fn of_veth(ifindex: u32, owner: Option<u64>) -> Option<Subject> {
    let slot = maps::POLICY_ENDPOINTS.get(host_veth_slot(ifindex))?;
    if slot.flags == 0 || slot.ifindex != ifindex || owner.is_some_and(|o| o != slot.owner) {
        return None;
    }
    Some(Subject { endpoint: slot })
}
