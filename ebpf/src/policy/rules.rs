//! Whether an isolated subject's rules allow a new flow: `POLICY_RULES` looked up with the
//! peer's identity, then with `IDENTITY_ANY` (rules over every peer). The trie's longest prefix
//! does protocols and port ranges.
use ebpf_common::{IDENTITY_ANY, POLICY_RULE_FULL_BITS};

use super::scratch::Scratch;
use crate::maps;

/// The `POLICY_COUNTS` slot of the policy allowing the subject's flow with `peer` on `port`, or
/// `None`.
#[inline(always)]
pub fn allowing(s: &mut Scratch, peer: u32, direction: u8, port: u16) -> Option<u32> {
    s.rule.prefix_len = POLICY_RULE_FULL_BITS;
    s.rule.data.subject = s.subject.identity;
    s.rule.data.peer = peer;
    s.rule.data.direction = direction;
    s.rule.data.protocol = s.key.protocol;
    s.rule.data.port_be = port.to_be_bytes();
    if let Some(rule) = maps::POLICY_RULES.get(&s.rule) {
        return Some(rule.slot);
    }
    s.rule.data.peer = IDENTITY_ANY;
    maps::POLICY_RULES.get(&s.rule).map(|rule| rule.slot)
}
