//! What changed between two compiles: the entries to write and the keys to remove, per map.
use std::collections::BTreeMap;

use ebpf_common::PolicyEndpoint;

use super::{compile::Compiled, compile::RuleKey, prefix::Prefix};

#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub identities: MapChanges<Prefix, u32>,
    pub endpoints: MapChanges<u32, PolicyEndpoint>,
    pub endpoints_by_ifindex: MapChanges<u32, PolicyEndpoint>,
    pub rules: MapChanges<RuleKey, u32>,
}

#[derive(Debug, PartialEq)]
pub struct MapChanges<K, V> {
    /// New or changed entries.
    pub write: Vec<(K, V)>,
    pub remove: Vec<K>,
}

impl<K, V> Default for MapChanges<K, V> {
    fn default() -> Self {
        Self { write: Vec::new(), remove: Vec::new() }
    }
}

impl<K, V> MapChanges<K, V> {
    pub fn len(&self) -> usize {
        self.write.len() + self.remove.len()
    }
}

impl Changes {
    pub fn between(old: &Compiled, new: &Compiled) -> Self {
        Self {
            identities: map_diff(&old.identities, &new.identities),
            endpoints: map_diff(&old.endpoints, &new.endpoints),
            endpoints_by_ifindex: map_diff(&old.endpoints_by_ifindex, &new.endpoints_by_ifindex),
            rules: map_diff(&old.rules, &new.rules),
        }
    }

    pub fn len(&self) -> usize {
        self.identities.len() + self.endpoints.len() + self.endpoints_by_ifindex.len() + self.rules.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn map_diff<K: Ord + Copy, V: PartialEq + Copy>(old: &BTreeMap<K, V>, new: &BTreeMap<K, V>) -> MapChanges<K, V> {
    let write = new.iter().filter(|(k, v)| old.get(k) != Some(v)).map(|(k, v)| (*k, *v)).collect();
    let remove = old.keys().filter(|k| !new.contains_key(k)).copied().collect();
    MapChanges { write, remove }
}
