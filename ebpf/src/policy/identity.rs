//! The identity of a peer address (`POLICY_IDENTITIES`, longest prefix): an address the agent
//! knows nothing of is the world's.
use ebpf_common::{FAMILY_IPV4, IDENTITY_WORLD, identity_prefix_len};

use super::{scratch, scratch::Scratch};
use crate::maps;

/// The identity of the source (`source`) or destination address of `s.key`.
#[inline(always)]
pub fn of(s: &mut Scratch, source: bool) -> u32 {
    let bits = if s.key.family == FAMILY_IPV4 { 32 } else { 128 };
    s.identity.prefix_len = identity_prefix_len(bits);
    let addr = if source { &raw const s.key.src_addr } else { &raw const s.key.dst_addr };
    // SAFETY: words of the scratch value, 4-aligned (`scratch.rs`): the family and its padding
    // as one word (little-endian: the family is its first byte), then the address.
    unsafe {
        let family_and_pad = (&raw mut s.identity.data).cast::<u32>();
        *family_and_pad = u32::from(s.key.family);
        scratch::copy16(&raw mut s.identity.data.addr, addr);
    }
    maps::POLICY_IDENTITIES.get(&s.identity).map_or(IDENTITY_WORLD, |found| found.identity)
}
