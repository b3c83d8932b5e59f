//! Whether an isolated subject's rules allow a new flow: `POLICY_RULES` looked up with the
//! peer's identity, then with `IDENTITY_ANY` (rules over every peer). The trie's longest prefix
//! does protocols and port ranges.
use aya_ebpf::maps::lpm_trie::Key;
use ebpf_common::{IDENTITY_ANY, POLICY_RULE_FULL_BITS, PolicyRuleKey};

use crate::maps;

/// The `POLICY_COUNTS` slot of the policy allowing it, or `None`.
#[inline(always)]
pub fn allowing(subject: u32, peer: u32, direction: u8, protocol: u8, port: u16) -> Option<u32> {
    let mut key = Key::new(
        POLICY_RULE_FULL_BITS,
        PolicyRuleKey { subject, peer, direction, protocol, port_be: port.to_be_bytes() },
    );
    if let Some(rule) = maps::POLICY_RULES.get(&key) {
        return Some(rule.slot);
    }
    key.data.peer = IDENTITY_ANY;
    maps::POLICY_RULES.get(&key).map(|rule| rule.slot)
}
