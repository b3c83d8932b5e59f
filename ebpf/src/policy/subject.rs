//! The pod a check is for: its `POLICY_ENDPOINTS` slot, found like its `HOST_VETHS` slot from
//! its host veth's ifindex. A slot of another veth or another attachment (a deleted pod's, not
//! yet rewritten) is not the pod's: not isolated. A pod in no policy's scope has flags 0 and
//! pays this one array read, which the verifier turns into an address computation.
use ebpf_common::{PolicyEndpoint, host_veth_slot};

use crate::maps;

/// A pod some policy isolates in at least one direction: its flows are tracked both ways, so
/// that the replies of what it opens (or accepts) pass the direction that is isolated.
/// The slot itself, not a copy: `from_pod`'s frame and the check's share 512 bytes of stack.
#[derive(Clone, Copy)]
pub struct Subject {
    pub endpoint: &'static PolicyEndpoint,
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
