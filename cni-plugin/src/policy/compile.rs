//! The compiler: the input into the three maps' whole contents. Pure: the agent and
//! `policy-set` diff its output against what they wrote before (`diff.rs`).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use ebpf_common::{
    IDENTITY_ANY, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED,
    POLICY_IDENTITIES_MAX_ENTRIES, POLICY_INGRESS_ISOLATED, POLICY_RULE_ANY_PORT_BITS, POLICY_RULE_ANY_PROTOCOL_BITS,
    POLICY_RULE_FULL_BITS, POLICY_RULES_MAX_ENTRIES, PolicyEndpoint, PolicyRuleKey, host_veth_slot,
};

use super::{
    identities::{self, Interner, Known},
    input::{Input, Local, NamedPort},
    names::Names,
    ports::{Ports, prefixes},
    prefix::Prefix,
    slots::Slots,
    spec::{Block, Namespaces, Peer, Policy, Rule},
};

/// A `POLICY_RULES` key with its `prefix_len`, ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleKey {
    pub subject: u32,
    pub peer: u32,
    pub direction: u8,
    pub protocol: u8,
    pub port_be: [u8; 2],
    pub prefix_len: u32,
}

impl RuleKey {
    pub fn key(&self) -> (PolicyRuleKey, u32) {
        let key = PolicyRuleKey {
            subject: self.subject,
            peer: self.peer,
            direction: self.direction,
            protocol: self.protocol,
            port_be: self.port_be,
        };
        (key, self.prefix_len)
    }
}

/// What the maps must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compiled {
    /// `POLICY_IDENTITIES`: prefix → identity.
    pub identities: BTreeMap<Prefix, u32>,
    /// `POLICY_ENDPOINTS`: slot → the local pod there.
    pub endpoints: BTreeMap<u32, PolicyEndpoint>,
    /// `POLICY_RULES`: key → the allowing policy's slot.
    pub rules: BTreeMap<RuleKey, u32>,
    pub names: Names,
    /// Invalid input, one line each (logged and counted by the caller).
    pub problems: Vec<String>,
    /// Policies whose podSelector matches no pod of the cluster (worth a line, not an error).
    pub unmatched: Vec<String>,
    pub policies: usize,
}

/// The compiler's memory between compiles: identity numbers and policy slots stay put.
#[derive(Default)]
pub struct Compiler {
    interner: Interner,
    slots: Slots,
    /// Slots given to new policies since [`Compiler::take_new_slots`]: their counts start at 0.
    new_slots: Vec<u32>,
}

/// A pod of this node, as a subject.
struct Subject<'a> {
    namespace: &'a str,
    labels: &'a super::selector::Labels,
    ports: &'a BTreeSet<NamedPort>,
    local: Local,
    identity: u32,
    flags: u32,
    slots: [u32; 2],
}

impl Compiler {
    /// The `POLICY_COUNTS` slot of a policy (0: none).
    #[cfg(test)]
    pub fn slot(&self, namespace: &str, name: &str) -> u32 {
        self.slots.get(namespace, name)
    }

    pub fn slots(&self) -> impl Iterator<Item = (&super::input::ObjectKey, u32)> {
        self.slots.iter()
    }

    pub fn take_new_slots(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.new_slots)
    }

    pub fn compile(&mut self, input: &Input) -> Compiled {
        let mut problems = Vec::new();
        let given = self.slots.assign(input.policies.keys(), &mut problems);
        self.new_slots.extend(given);
        let policies: Vec<Policy> = input.policies.values().filter_map(|p| Policy::read(p, &mut problems)).collect();
        for p in policies.iter().filter(|p| !input.namespaces.contains_key(&p.namespace)) {
            problems.push(format!("NetworkPolicy {}/{}: namespace {:?} is unknown", p.namespace, p.name, p.namespace));
        }
        let blocks: BTreeSet<Block> = policies
            .iter()
            .flat_map(|p| p.ingress.iter().chain(&p.egress).flatten())
            .flat_map(|r| r.peers.iter().flatten())
            .filter_map(|peer| if let Peer::Block(b) = peer { Some(b.clone()) } else { None })
            .collect();
        let table = identities::build(input, &blocks, &mut self.interner, &mut problems);
        let mut subjects = self.subjects(input, &table);
        let by_block = blocks_index(&table.known);
        let mut rules = BTreeMap::new();
        let mut unmatched = Vec::new();
        for policy in &policies {
            let slot = self.slots.get(&policy.namespace, &policy.name);
            let selects = |namespace: &str, labels| namespace == policy.namespace && policy.subjects.matches(labels);
            if !input.pods.values().any(|p| selects(&p.namespace, &p.labels)) {
                unmatched.push(format!("{}/{}", policy.namespace, policy.name));
            }
            let chosen: Vec<usize> =
                (0..subjects.len()).filter(|i| selects(subjects[*i].namespace, subjects[*i].labels)).collect();
            if chosen.is_empty() {
                continue;
            }
            for (direction, rules_of) in
                [(POLICY_DIRECTION_INGRESS, &policy.ingress), (POLICY_DIRECTION_EGRESS, &policy.egress)]
            {
                let Some(policy_rules) = rules_of else { continue };
                let flag = if direction == POLICY_DIRECTION_INGRESS {
                    POLICY_INGRESS_ISOLATED
                } else {
                    POLICY_EGRESS_ISOLATED
                };
                for &i in &chosen {
                    let subject = &mut subjects[i];
                    subject.flags |= flag;
                    let counted = &mut subject.slots[usize::from(direction)];
                    if *counted == 0 {
                        *counted = slot;
                    }
                }
                // Pods of one identity get the same entries (the same named ports too): once.
                let identities: BTreeMap<u32, &BTreeSet<NamedPort>> =
                    chosen.iter().map(|&i| (subjects[i].identity, subjects[i].ports)).collect();
                for rule in policy_rules {
                    let peers = resolve(rule, input, &table.known, &by_block);
                    for (&subject, ports) in &identities {
                        let emit = Emit { subject, ports, direction, slot };
                        emit.rule(rule, peers.as_deref(), &table.known, &mut rules);
                    }
                }
            }
        }
        let endpoints = endpoints(&subjects, &mut problems);
        if rules.len() > POLICY_RULES_MAX_ENTRIES as usize {
            problems.push(format!("{} rule entries, more than POLICY_RULES holds ({POLICY_RULES_MAX_ENTRIES}): some allowed flows will be denied", rules.len()));
        }
        if table.entries.len() > POLICY_IDENTITIES_MAX_ENTRIES as usize {
            problems.push(format!("{} identity entries, more than POLICY_IDENTITIES holds", table.entries.len()));
        }
        let names = Names::new(input, &table, &self.slots);
        Compiled { identities: table.entries, endpoints, rules, names, problems, unmatched, policies: policies.len() }
    }

    /// The node's pods the API knows, each with its identity (its first address's).
    fn subjects<'a>(&self, input: &'a Input, table: &identities::Table) -> Vec<Subject<'a>> {
        let mut out = Vec::new();
        for (key, pod) in &input.pods {
            let Some(local) = pod.ips.iter().find_map(|ip| input.locals.get(ip)) else { continue };
            let Some(ids) = table.pods.get(key) else { continue };
            let Some(identity) = pod.ips.iter().find_map(|ip| ids.iter().find(|(a, _)| a == ip).map(|(_, id)| *id))
            else {
                continue;
            };
            let (namespace, labels, ports) = (pod.namespace.as_str(), &pod.labels, &pod.ports);
            out.push(Subject { namespace, labels, ports, local: *local, identity, flags: 0, slots: [0, 0] });
        }
        out
    }
}

/// `POLICY_ENDPOINTS` by slot. Two live veths in one slot: the later (higher ifindex) has it,
/// and the other pod, not isolated, is said.
fn endpoints(subjects: &[Subject<'_>], problems: &mut Vec<String>) -> BTreeMap<u32, PolicyEndpoint> {
    let mut out: BTreeMap<u32, PolicyEndpoint> = BTreeMap::new();
    for s in subjects {
        let entry = PolicyEndpoint {
            ifindex: s.local.ifindex,
            flags: s.flags,
            owner: s.local.owner,
            identity: s.identity,
            ingress_slot: s.slots[0],
            egress_slot: s.slots[1],
            pad: 0,
        };
        let slot = host_veth_slot(s.local.ifindex);
        match out.get(&slot) {
            Some(held) if held.ifindex == entry.ifindex => {}
            Some(held) => {
                let lost = held.ifindex.min(entry.ifindex);
                problems.push(format!(
                    "host veths {} and {} share POLICY_ENDPOINTS slot {slot}: ifindex {lost} is not enforced",
                    held.ifindex, entry.ifindex
                ));
                if entry.ifindex > held.ifindex {
                    out.insert(slot, entry);
                }
            }
            None => {
                out.insert(slot, entry);
            }
        }
    }
    out
}

/// Each block's identities (indexes into `known`).
fn blocks_index(known: &[Known]) -> HashMap<&Block, Vec<usize>> {
    let mut out: HashMap<&Block, Vec<usize>> = HashMap::new();
    for (i, k) in known.iter().enumerate() {
        for block in &k.blocks {
            out.entry(block).or_default().push(i);
        }
    }
    out
}

/// The identities a rule's peers name; `None`: every address (`IDENTITY_ANY`).
fn resolve(rule: &Rule, input: &Input, known: &[Known], by_block: &HashMap<&Block, Vec<usize>>) -> Option<Vec<usize>> {
    let peers = rule.peers.as_ref()?;
    let mut out = BTreeSet::new();
    for peer in peers {
        match peer {
            Peer::Nothing => {}
            Peer::Block(block) => out.extend(by_block.get(block).into_iter().flatten().copied()),
            Peer::Pods { namespaces, pods } => {
                let no_labels = Default::default();
                let in_namespace = |ns: &str| match namespaces {
                    Namespaces::Own(own) => own == ns,
                    Namespaces::Matching(s) => s.matches(input.namespaces.get(ns).unwrap_or(&no_labels)),
                };
                out.extend((0..known.len()).filter(|&i| {
                    known[i].pod.as_ref().is_some_and(|p| in_namespace(&p.namespace) && pods.matches(&p.labels))
                }));
            }
        }
    }
    Some(out.into_iter().collect())
}

/// Writes one subject's entries for a rule.
struct Emit<'a> {
    subject: u32,
    ports: &'a BTreeSet<NamedPort>,
    direction: u8,
    slot: u32,
}

impl Emit<'_> {
    fn rule(&self, rule: &Rule, peers: Option<&[usize]>, known: &[Known], rules: &mut BTreeMap<RuleKey, u32>) {
        let peer_ids: Vec<u32> = match peers {
            None => vec![IDENTITY_ANY],
            Some(p) => p.iter().map(|&i| known[i].id).collect(),
        };
        let Some(specs) = &rule.ports else {
            for &peer in &peer_ids {
                self.insert(rules, peer, 0, [0, 0], POLICY_RULE_ANY_PROTOCOL_BITS);
            }
            return;
        };
        for spec in specs {
            match &spec.ports {
                Ports::All => {
                    for &peer in &peer_ids {
                        self.insert(rules, peer, spec.protocol, [0, 0], POLICY_RULE_ANY_PORT_BITS);
                    }
                }
                Ports::Range(first, last) => {
                    for (port_be, bits) in prefixes(*first, *last) {
                        for &peer in &peer_ids {
                            self.insert(rules, peer, spec.protocol, port_be, POLICY_RULE_ANY_PORT_BITS + bits);
                        }
                    }
                }
                Ports::Named(name) if self.direction == POLICY_DIRECTION_INGRESS => {
                    // The subject's own container port of that name and protocol.
                    for p in self.ports.iter().filter(|p| &p.name == name && p.protocol == spec.protocol) {
                        for &peer in &peer_ids {
                            self.insert(rules, peer, spec.protocol, p.port.to_be_bytes(), POLICY_RULE_FULL_BITS);
                        }
                    }
                }
                Ports::Named(name) => {
                    // Each peer's own port of that name: entries for exact peer identities, also
                    // when the rule names every peer.
                    let candidates: Vec<&Known> = match peers {
                        None => known.iter().collect(),
                        Some(p) => p.iter().map(|&i| &known[i]).collect(),
                    };
                    for peer in candidates {
                        let Some(pod) = &peer.pod else { continue };
                        for p in pod.ports.iter().filter(|p| &p.name == name && p.protocol == spec.protocol) {
                            self.insert(rules, peer.id, spec.protocol, p.port.to_be_bytes(), POLICY_RULE_FULL_BITS);
                        }
                    }
                }
            }
        }
    }

    /// The first policy (by namespace/name) to allow a key keeps it.
    fn insert(&self, rules: &mut BTreeMap<RuleKey, u32>, peer: u32, protocol: u8, port_be: [u8; 2], prefix_len: u32) {
        let key = RuleKey { subject: self.subject, peer, direction: self.direction, protocol, port_be, prefix_len };
        rules.entry(key).or_insert(self.slot);
    }
}
