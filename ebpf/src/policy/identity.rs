//! The identity of a peer address (`POLICY_IDENTITIES`, longest prefix): an address the agent
//! knows nothing of is the world's.
use aya_ebpf::maps::lpm_trie::Key;
use ebpf_common::{FAMILY_IPV4, FlowKey, IDENTITY_WORLD, IpKey, identity_prefix_len};

use crate::maps;

/// The identity of `key`'s source (`source`) or destination address.
#[inline(always)]
pub fn of(key: &FlowKey, source: bool) -> u32 {
    let addr = if source { key.src_addr } else { key.dst_addr };
    let bits = if key.family == FAMILY_IPV4 { 32 } else { 128 };
    let lookup = Key::new(identity_prefix_len(bits), IpKey { family: key.family, pad: [0; 3], addr });
    maps::POLICY_IDENTITIES.get(&lookup).map_or(IDENTITY_WORLD, |found| found.identity)
}
