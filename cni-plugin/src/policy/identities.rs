//! Identities: every address the rules may name gets the number of what it is (a pod's
//! namespace, labels and named ports, or no pod) and of the `ipBlock`s it is in. Numbers are
//! interned for the agent's life, so a recompile gives an unchanged address the same number and
//! the maps' diff stays small; a restarted agent numbers the same input the same way (sorted).
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ebpf_common::{IDENTITY_FIRST_ALLOCATED, IDENTITY_HOST, IDENTITY_WORLD};

use super::{
    input::{Input, NamedPort, ObjectKey},
    prefix::Prefix,
    selector::Labels,
    spec::Block,
};

/// The pod part of an identity.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodPart {
    pub namespace: String,
    pub labels: Labels,
    pub ports: BTreeSet<NamedPort>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdentityKey {
    /// `None`: addresses of no pod (an `ipBlock` region).
    pub pod: Option<PodPart>,
    pub blocks: BTreeSet<Block>,
}

#[derive(Default)]
pub struct Interner {
    numbers: HashMap<IdentityKey, u32>,
    /// Numbers are never given twice: a flow judged against a gone identity never meets a new one.
    next: u32,
}

impl Interner {
    /// An address region in no block is `IDENTITY_WORLD`.
    fn number(&mut self, key: &IdentityKey) -> u32 {
        if key.pod.is_none() && key.blocks.is_empty() {
            return IDENTITY_WORLD;
        }
        if let Some(n) = self.numbers.get(key) {
            return *n;
        }
        let n = self.next.max(IDENTITY_FIRST_ALLOCATED);
        self.next = n + 1;
        self.numbers.insert(key.clone(), n);
        n
    }

    /// Forgets the keys no address has any more (their numbers stay spent).
    fn keep(&mut self, used: &HashSet<u32>) {
        self.numbers.retain(|_, n| used.contains(n));
    }
}

/// One identity the rules may name as a peer.
pub struct Known {
    pub id: u32,
    pub pod: Option<PodPart>,
    pub blocks: BTreeSet<Block>,
}

pub struct Table {
    /// `POLICY_IDENTITIES`.
    pub entries: BTreeMap<Prefix, u32>,
    /// Every identity but WORLD, once: HOST (blocks holding a node address) first.
    pub known: Vec<Known>,
    /// Each pod's identity by address.
    pub pods: BTreeMap<ObjectKey, Vec<(std::net::IpAddr, u32)>>,
}

/// Blocks by their CIDR: the blocks holding a prefix are among those whose CIDR is one of its
/// (at most 129) leading prefixes, so 10,000 blocks cost lookups, not a walk per address.
struct BlockIndex<'a> {
    by_cidr: HashMap<Prefix, Vec<&'a Block>>,
}

impl<'a> BlockIndex<'a> {
    fn new(blocks: &'a BTreeSet<Block>) -> Self {
        let mut by_cidr: HashMap<Prefix, Vec<&Block>> = HashMap::new();
        for block in blocks {
            by_cidr.entry(block.cidr).or_default().push(block);
        }
        Self { by_cidr }
    }

    fn holding(&self, prefix: &Prefix) -> BTreeSet<Block> {
        (0..=prefix.bits)
            .filter_map(|bits| self.by_cidr.get(&Prefix::new(prefix.addr, bits)))
            .flatten()
            .filter(|b| b.contains(prefix))
            .map(|b| (*b).clone())
            .collect()
    }
}

/// Numbers every pod address, every boundary of `blocks`, both `/0`s and the node's addresses.
pub fn build(input: &Input, blocks: &BTreeSet<Block>, interner: &mut Interner, problems: &mut Vec<String>) -> Table {
    let index = BlockIndex::new(blocks);
    let in_blocks = |p: &Prefix| index.holding(p);
    // Keys first, sorted, then numbered: the first compile numbers in a stable order.
    let mut keyed: BTreeMap<IdentityKey, Vec<Prefix>> = BTreeMap::new();
    let mut owner: BTreeMap<std::net::IpAddr, &ObjectKey> = BTreeMap::new();
    for (key, pod) in &input.pods {
        let part = PodPart { namespace: pod.namespace.clone(), labels: pod.labels.clone(), ports: pod.ports.clone() };
        for ip in &pod.ips {
            if input.node_addrs.contains(ip) {
                problems.push(format!("pod {}/{} has the node's address {ip}: taken as the node", key.0, key.1));
                continue;
            }
            if let Some(first) = owner.insert(*ip, key) {
                problems.push(format!("pods {}/{} and {}/{} both have {ip}: left out", first.0, first.1, key.0, key.1));
                continue;
            }
            let host = Prefix::host(*ip);
            keyed.entry(IdentityKey { pod: Some(part.clone()), blocks: in_blocks(&host) }).or_default().push(host);
        }
    }
    let regions =
        blocks.iter().flat_map(Block::boundaries).chain([Prefix::everything(false), Prefix::everything(true)]);
    for region in regions.collect::<BTreeSet<_>>() {
        keyed.entry(IdentityKey { pod: None, blocks: in_blocks(&region) }).or_default().push(region);
    }
    let mut entries = BTreeMap::new();
    let host_blocks: BTreeSet<Block> =
        blocks.iter().filter(|b| input.node_addrs.iter().any(|a| b.contains(&Prefix::host(*a)))).cloned().collect();
    let mut known = vec![Known { id: IDENTITY_HOST, pod: None, blocks: host_blocks }];
    let mut used = HashSet::new();
    for (key, prefixes) in keyed {
        let id = interner.number(&key);
        used.insert(id);
        for prefix in prefixes {
            // A pod's address that is also a boundary is the pod's (it holds the same blocks).
            if key.pod.is_some() {
                entries.insert(prefix, id);
            } else {
                entries.entry(prefix).or_insert(id);
            }
        }
        if id != IDENTITY_WORLD {
            known.push(Known { id, pod: key.pod, blocks: key.blocks });
        }
    }
    interner.keep(&used);
    for addr in &input.node_addrs {
        entries.insert(Prefix::host(*addr), IDENTITY_HOST);
    }
    let mut pods: BTreeMap<ObjectKey, Vec<_>> = BTreeMap::new();
    for (ip, key) in owner {
        if let Some(id) = entries.get(&Prefix::host(ip)) {
            pods.entry(key.clone()).or_default().push((ip, *id));
        }
    }
    Table { entries, known, pods }
}
