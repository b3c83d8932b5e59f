//! Each NetworkPolicy's `POLICY_COUNTS` slot: kept while the policy lives, the first free one
//! (1 and up) for a new policy, freed when it goes.
use std::collections::{BTreeMap, BTreeSet};

use ebpf_common::POLICY_SLOTS;

use super::input::ObjectKey;

#[derive(Default)]
pub struct Slots {
    by_policy: BTreeMap<ObjectKey, u32>,
}

impl Slots {
    /// Gives every policy of `present` its slot; a policy past the last slot gets 0 (counted
    /// with no policy), said in `problems`. Returns the slots newly given.
    pub fn assign<'a>(&mut self, present: impl Iterator<Item = &'a ObjectKey>, problems: &mut Vec<String>) -> Vec<u32> {
        let mut given = Vec::new();
        let present: BTreeSet<&ObjectKey> = present.collect();
        self.by_policy.retain(|k, _| present.contains(k));
        let used: BTreeSet<u32> = self.by_policy.values().copied().collect();
        let mut free = (1..POLICY_SLOTS).filter(|s| !used.contains(s));
        for key in present {
            if self.by_policy.contains_key(key) {
                continue;
            }
            match free.next() {
                Some(slot) => {
                    self.by_policy.insert(key.clone(), slot);
                    given.push(slot);
                }
                None => problems.push(format!("NetworkPolicy {}/{}: no counter slot left", key.0, key.1)),
            }
        }
        given
    }

    pub fn get(&self, namespace: &str, name: &str) -> u32 {
        self.by_policy.get(&(namespace.to_string(), name.to_string())).copied().unwrap_or(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, u32)> {
        self.by_policy.iter().map(|(k, s)| (k, *s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ("ns".into(), name.into())
    }

    #[test]
    fn slots_stay_and_free_ones_are_reused_first() {
        let mut slots = Slots::default();
        let mut problems = Vec::new();
        slots.assign([key("a"), key("b"), key("c")].iter(), &mut problems);
        assert_eq!((slots.get("ns", "a"), slots.get("ns", "b"), slots.get("ns", "c")), (1, 2, 3));
        slots.assign([key("a"), key("c"), key("d")].iter(), &mut problems);
        assert_eq!((slots.get("ns", "a"), slots.get("ns", "c"), slots.get("ns", "d")), (1, 3, 2));
        assert_eq!(slots.get("ns", "b"), 0);
        assert!(problems.is_empty());
    }
}
