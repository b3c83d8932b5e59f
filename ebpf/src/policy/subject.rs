//! The pod a check is for: its `POLICY_ENDPOINTS` slot, found like its `HOST_VETHS` slot from
//! its host veth's ifindex. A pod in no policy's scope has flags 0 and pays this one array
//! read, which the verifier turns into an address computation.
//!
//! Two live veths whose ifindexes are equal modulo the slots share one: the agent leaves one in
//! the slot and writes the other in `POLICY_ENDPOINTS_BY_IFINDEX`, looked up only when the slot
//! holds another ifindex, so both are enforced (a slot never decides for another pod). An empty
//! slot (0) is a pod the agent has not written (yet): not isolated, the documented default.
//! An entry of another attachment (a deleted pod's, not yet cleared) is not the pod's either.
use ebpf_common::{PolicyEndpoint, host_veth_slot};

use crate::maps;

/// A pod some policy isolates in at least one direction: its flows are tracked both ways, so
/// that the replies of what it opens (or accepts) pass the direction that is isolated.
/// The entry itself, not a copy: `from_pod`'s frame and the check's share 512 bytes of stack.
#[derive(Clone, Copy)]
pub struct Subject {
    pub endpoint: &'static PolicyEndpoint,
}

/// The pod behind host veth `ifindex`, if some policy isolates it. `owner`, when known (the
/// `ENDPOINTS` entry's), must be the entry's too.
#[inline(always)]
pub fn of_veth(ifindex: u32, owner: Option<u64>) -> Option<Subject> {
    let mut entry = maps::POLICY_ENDPOINTS.get(host_veth_slot(ifindex))?;
    if entry.ifindex != ifindex {
        if entry.ifindex == 0 {
            return None;
        }
        // SAFETY: a hash map value, only read while this program runs (the agent replaces
        // entries whole).
        entry = unsafe { maps::POLICY_ENDPOINTS_BY_IFINDEX.get(&ifindex) }?;
        if entry.ifindex != ifindex {
            return None;
        }
    }
    if entry.flags == 0 || owner.is_some_and(|o| o != entry.owner) {
        return None;
    }
    Some(Subject { endpoint: entry })
}
