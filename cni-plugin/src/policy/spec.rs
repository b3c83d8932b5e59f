//! A NetworkPolicy read into what the compiler needs, checked: what is invalid is said (a
//! problem, logged and counted) and allows nothing, never more than the policy meant.
use std::collections::BTreeSet;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};

use super::{ports::PortSpec, prefix::Prefix, selector::Selector};

pub struct Policy {
    pub namespace: String,
    pub name: String,
    pub subjects: Selector,
    /// `None`: the policy does not isolate its pods that way. `Some(rules)`: it does, and these
    /// allow (none: nothing is allowed).
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
}

pub struct Rule {
    /// `None`: every peer (`from`/`to` absent or empty).
    pub peers: Option<Vec<Peer>>,
    /// `None`: every protocol and port (`ports` absent or empty). `Some` entries that were
    /// invalid are left out, so a rule of only invalid ports allows nothing.
    pub ports: Option<Vec<PortSpec>>,
}

pub enum Peer {
    Pods {
        namespaces: Namespaces,
        pods: Selector,
    },
    Block(Block),
    /// An invalid peer: matches no one.
    Nothing,
}

pub enum Namespaces {
    /// The policy's own namespace (no `namespaceSelector`).
    Own(String),
    Matching(Selector),
}

/// An `ipBlock`: in it are the addresses in `cidr` and in no `except`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Block {
    pub cidr: Prefix,
    pub except: BTreeSet<Prefix>,
}

impl Block {
    /// Whether the whole of `prefix` is in the block. For a prefix that is the longest match of
    /// some address among entries holding every `cidr` and `except` boundary, that is whether
    /// the address is.
    pub fn contains(&self, prefix: &Prefix) -> bool {
        self.cidr.contains(prefix) && !self.except.iter().any(|e| e.contains(prefix))
    }

    pub fn boundaries(&self) -> impl Iterator<Item = Prefix> + '_ {
        std::iter::once(self.cidr).chain(self.except.iter().copied())
    }
}

impl Policy {
    /// `None` when the policy selects no pod it can be sure of (an invalid `podSelector`).
    pub fn read(policy: &NetworkPolicy, problems: &mut Vec<String>) -> Option<Self> {
        let namespace = policy.metadata.namespace.clone().unwrap_or_default();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let at = format!("NetworkPolicy {namespace}/{name}");
        let mut problem = |what: String| problems.push(format!("{at}: {what}"));
        let spec = policy.spec.clone().unwrap_or_default();
        let subjects = match Selector::parse(&spec.pod_selector.unwrap_or_default()) {
            Ok(s) => s,
            Err(e) => {
                problem(format!("podSelector: {e}; the policy is ignored"));
                return None;
            }
        };
        let has_egress = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
        let (ingress_type, egress_type) = policy_types(spec.policy_types.as_deref(), has_egress, &mut problem);
        let ingress = ingress_type.then(|| {
            let rules = spec.ingress.unwrap_or_default();
            rules.iter().map(|r| rule(r.from.as_deref(), r.ports.as_deref(), &namespace, &mut problem)).collect()
        });
        let egress = egress_type.then(|| {
            let rules = spec.egress.unwrap_or_default();
            rules.iter().map(|r| rule(r.to.as_deref(), r.ports.as_deref(), &namespace, &mut problem)).collect()
        });
        Some(Self { namespace, name, subjects, ingress, egress })
    }
}

/// `policyTypes`, or the API's default when absent: Ingress always, Egress when the policy has
/// egress rules.
fn policy_types(types: Option<&[String]>, has_egress: bool, problem: &mut impl FnMut(String)) -> (bool, bool) {
    let Some(types) = types.filter(|t| !t.is_empty()) else { return (true, has_egress) };
    let (mut ingress, mut egress) = (false, false);
    for t in types {
        match t.as_str() {
            "Ingress" => ingress = true,
            "Egress" => egress = true,
            other => problem(format!("unknown policyType {other:?} ignored")),
        }
    }
    (ingress, egress)
}

fn rule(
    peers: Option<&[NetworkPolicyPeer]>,
    ports: Option<&[NetworkPolicyPort]>,
    namespace: &str,
    problem: &mut impl FnMut(String),
) -> Rule {
    let peers = peers.filter(|p| !p.is_empty()).map(|p| p.iter().map(|p| peer(p, namespace, problem)).collect());
    let ports = ports.filter(|p| !p.is_empty()).map(|ports| {
        ports
            .iter()
            .filter_map(|p| PortSpec::parse(p).map_err(|e| problem(format!("port left out: {e}"))).ok())
            .collect()
    });
    Rule { peers, ports }
}

fn peer(peer: &NetworkPolicyPeer, namespace: &str, problem: &mut impl FnMut(String)) -> Peer {
    let selectors = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
    match (&peer.ip_block, selectors) {
        (Some(block), false) => {
            let cidr = Prefix::parse(&block.cidr);
            let except: Option<BTreeSet<Prefix>> = block.except.iter().flatten().map(|e| Prefix::parse(e)).collect();
            match (cidr, except) {
                (Some(cidr), Some(except)) => Peer::Block(Block { cidr, except }),
                _ => {
                    problem(format!(
                        "ipBlock {:?} except {:?} is invalid: it matches nothing",
                        block.cidr, block.except
                    ));
                    Peer::Nothing
                }
            }
        }
        (None, true) => {
            let pods = Selector::parse(&peer.pod_selector.clone().unwrap_or_default());
            let namespaces = match &peer.namespace_selector {
                None => Ok(Namespaces::Own(namespace.to_string())),
                Some(s) => Selector::parse(s).map(Namespaces::Matching),
            };
            match (pods, namespaces) {
                (Ok(pods), Ok(namespaces)) => Peer::Pods { namespaces, pods },
                (Err(e), _) | (_, Err(e)) => {
                    problem(format!("peer selector: {e}: it matches nothing"));
                    Peer::Nothing
                }
            }
        }
        (Some(_), true) => {
            problem("a peer with both ipBlock and selectors: it matches nothing".into());
            Peer::Nothing
        }
        (None, false) => {
            problem("an empty peer: it matches nothing".into());
            Peer::Nothing
        }
    }
}
