//! The NetworkPolicy maps of a network (`POLICY_IDENTITIES`, `POLICY_ENDPOINTS` and
//! `POLICY_ENDPOINTS_BY_IFINDEX`, `POLICY_RULES`), written from the compiler's changes, and what the agent reads back: the
//! node's pods in `ENDPOINTS`, the per-policy counts in `POLICY_COUNTS`. Only for programs
//! loaded with `FEATURE_POLICY`: older pins lack the maps, and their programs would not look.
use std::{collections::BTreeMap, net::IpAddr};

use anyhow::{Context as _, Result};
use aya::maps::{
    Array, HashMap, MapData, PerCpuArray,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_common::{
    ENDPOINT_LINK_LOCAL, FAMILY_IPV4, FEATURE_POLICY, IDENTITY_PREFIX_OFFSET, IpKey, PolicyCount, PolicyEndpoint,
    PolicyIdentity, PolicyRule, PolicyRuleKey, names,
};

use super::{Pins, nat::has_feature, read};
use crate::policy::{Changes, Compiled, Local, Prefix, RuleKey};

pub struct PolicyMaps {
    identities: LpmTrie<MapData, IpKey, PolicyIdentity>,
    endpoints: Array<MapData, PolicyEndpoint>,
    endpoints_by_ifindex: HashMap<MapData, u32, PolicyEndpoint>,
    rules: LpmTrie<MapData, PolicyRuleKey, PolicyRule>,
}

/// Whether the programs pinned at `pins` enforce NetworkPolicy.
pub fn enforces_policy(pins: &Pins) -> bool {
    has_feature(pins, FEATURE_POLICY)
}

/// What a write did: entries written or removed, and those that failed (a full map).
#[derive(Debug, Default)]
pub struct Applied {
    pub done: usize,
    pub failed: usize,
    pub first_error: Option<String>,
}

impl PolicyMaps {
    /// The maps, once the programs have `FEATURE_POLICY` (`None` otherwise).
    pub fn open(pins: &Pins) -> Result<Option<Self>> {
        if !enforces_policy(pins) {
            return Ok(None);
        }
        Ok(Some(Self {
            identities: LpmTrie::try_from(read::open_map(pins, names::POLICY_IDENTITIES)?)?,
            endpoints: Array::try_from(read::open_map(pins, names::POLICY_ENDPOINTS)?)?,
            endpoints_by_ifindex: HashMap::try_from(read::open_map(pins, names::POLICY_ENDPOINTS_BY_IFINDEX)?)?,
            rules: LpmTrie::try_from(read::open_map(pins, names::POLICY_RULES)?)?,
        }))
    }

    /// What the maps hold now, as a compile's output (names and problems empty): a new writer
    /// diffs against it, so an agent restarted over its predecessor's entries rewrites only what
    /// changed, and removes what it no longer wants.
    pub fn contents(&self) -> Result<Compiled> {
        let mut held = Compiled::default();
        for entry in self.identities.iter() {
            let (key, value) = entry.context("reading POLICY_IDENTITIES")?;
            if let Some(prefix) = prefix_of(&key) {
                held.identities.insert(prefix, value.identity);
            }
        }
        for (slot, entry) in self.endpoints.iter().enumerate() {
            let entry = entry.context("reading POLICY_ENDPOINTS")?;
            if entry.ifindex != 0 {
                held.endpoints.insert(slot as u32, entry);
            }
        }
        for entry in self.endpoints_by_ifindex.iter() {
            let (ifindex, entry) = entry.context("reading POLICY_ENDPOINTS_BY_IFINDEX")?;
            held.endpoints_by_ifindex.insert(ifindex, entry);
        }
        for entry in self.rules.iter() {
            let (key, value) = entry.context("reading POLICY_RULES")?;
            let k = key.data();
            let rule = RuleKey {
                subject: k.subject,
                peer: k.peer,
                direction: k.direction,
                protocol: k.protocol,
                port_be: k.port_be,
                prefix_len: key.prefix_len(),
            };
            held.rules.insert(rule, value.slot);
        }
        Ok(held)
    }

    /// Writes `changes` in the order that keeps new flows' verdicts right meanwhile: new rules
    /// before the identities and isolation that need them; old rules and identities last. A pod
    /// leaving a shared slot is written by ifindex before its neighbour takes the slot (the
    /// datapath looks there once the slot holds another ifindex), and gone by-ifindex entries
    /// are removed after the slots (a pod moving into its slot is never without an entry).
    pub fn apply(&mut self, changes: &Changes) -> Applied {
        let mut applied = Applied::default();
        let mut note = |result: Result<(), aya::maps::MapError>, what: &dyn Fn() -> String| match result {
            Ok(()) => applied.done += 1,
            Err(e) => {
                applied.failed += 1;
                applied.first_error.get_or_insert_with(|| format!("{}: {e}", what()));
            }
        };
        for (rule, slot) in &changes.rules.write {
            let (key, len) = rule.key();
            note(self.rules.insert(&Key::new(len, key), PolicyRule { slot: *slot, pad: 0 }, 0), &|| {
                format!("rule {rule:?}")
            });
        }
        for (prefix, identity) in &changes.identities.write {
            let (key, len) = prefix.key();
            let value = PolicyIdentity { identity: *identity, pad: 0 };
            note(self.identities.insert(&Key::new(len, key), value, 0), &|| format!("identity of {prefix}"));
        }
        for (ifindex, entry) in &changes.endpoints_by_ifindex.write {
            note(self.endpoints_by_ifindex.insert(ifindex, entry, 0), &|| format!("endpoint of ifindex {ifindex}"));
        }
        for (slot, entry) in &changes.endpoints.write {
            note(self.endpoints.set(*slot, entry, 0), &|| format!("endpoint slot {slot}"));
        }
        for slot in &changes.endpoints.remove {
            note(self.endpoints.set(*slot, PolicyEndpoint::default(), 0), &|| format!("endpoint slot {slot}"));
        }
        for ifindex in &changes.endpoints_by_ifindex.remove {
            note(ignore_missing(self.endpoints_by_ifindex.remove(ifindex)), &|| {
                format!("endpoint of ifindex {ifindex}")
            });
        }
        for rule in &changes.rules.remove {
            let (key, len) = rule.key();
            note(ignore_missing(self.rules.remove(&Key::new(len, key))), &|| format!("rule {rule:?}"));
        }
        for prefix in &changes.identities.remove {
            let (key, len) = prefix.key();
            note(ignore_missing(self.identities.remove(&Key::new(len, key))), &|| format!("identity of {prefix}"));
        }
        applied
    }
}

fn ignore_missing(result: Result<(), aya::maps::MapError>) -> Result<(), aya::maps::MapError> {
    match result {
        Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        other => other,
    }
}

fn prefix_of(key: &Key<IpKey>) -> Option<Prefix> {
    let data = key.data();
    let bits = u8::try_from(key.prefix_len().checked_sub(IDENTITY_PREFIX_OFFSET)?).ok()?;
    let addr: IpAddr = if data.family == FAMILY_IPV4 {
        let a = data.addr;
        IpAddr::from([a[0], a[1], a[2], a[3]])
    } else {
        IpAddr::from(data.addr)
    };
    Some(Prefix::new(addr, bits))
}

/// The node's pods by address, from `ENDPOINTS` (link-local entries left out).
pub fn local_pods(pins: &Pins) -> Result<BTreeMap<IpAddr, Local>> {
    let mut out = BTreeMap::new();
    for (key, endpoint) in read::endpoint_entries(pins)? {
        if endpoint.flags & ENDPOINT_LINK_LOCAL != 0 {
            continue;
        }
        let addr: IpAddr = if key.family == FAMILY_IPV4 {
            IpAddr::from([key.addr[0], key.addr[1], key.addr[2], key.addr[3]])
        } else {
            IpAddr::from(key.addr)
        };
        out.insert(addr, Local { ifindex: endpoint.host_ifindex, owner: endpoint.owner });
    }
    Ok(out)
}

/// Flows allowed and denied per slot (summed over CPUs), for the slots asked.
pub fn policy_counts(pins: &Pins, slots: impl Iterator<Item = u32>) -> Result<BTreeMap<u32, PolicyCount>> {
    let counts: PerCpuArray<_, PolicyCount> = PerCpuArray::try_from(read::open_map(pins, names::POLICY_COUNTS)?)?;
    let mut out = BTreeMap::new();
    for slot in slots {
        let per_cpu = counts.get(&slot, 0).with_context(|| format!("reading POLICY_COUNTS[{slot}]"))?;
        let sum = per_cpu.iter().fold(PolicyCount::default(), |a, c| PolicyCount {
            allowed_flows: a.allowed_flows + c.allowed_flows,
            denied_flows: a.denied_flows + c.denied_flows,
        });
        out.insert(slot, sum);
    }
    Ok(out)
}

/// Zeroes the counts of slots given to new policies (a freed slot's old counts are not theirs).
pub fn reset_counts(pins: &Pins, slots: &[u32]) -> Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let mut counts: PerCpuArray<_, PolicyCount> = PerCpuArray::try_from(read::open_map(pins, names::POLICY_COUNTS)?)?;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    for slot in slots {
        let zeros = aya::maps::PerCpuValues::try_from(vec![PolicyCount::default(); cpus])?;
        counts.set(*slot, zeros, 0)?;
    }
    Ok(())
}

/// The node's addresses the datapath was loaded with (`SETTINGS`): the node, `IDENTITY_HOST`.
pub fn node_addrs(pins: &Pins) -> Result<Vec<IpAddr>> {
    let settings = read::settings(pins)?;
    let v4 = Some(settings.node_ipv4).filter(|a| *a != [0; 4]).map(IpAddr::from);
    let v6 = Some(settings.node_ipv6).filter(|a| *a != [0; 16]).map(IpAddr::from);
    Ok(v4.into_iter().chain(v6).collect())
}
