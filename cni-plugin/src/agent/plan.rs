//! What one sync should do to the routes: a pure function of the routes wanted (from the nodes)
//! and the routes present, ours and everyone else's.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
};

use ipnetwork::Ipv4Network;

use crate::{kube::Node, net::routes::MainRoutes};

/// Destination → gateway.
pub type Routes = BTreeMap<Ipv4Network, Ipv4Addr>;

/// Every other node's IPv4 pod CIDR via its InternalIP. Nodes without either yet (a new node
/// before the controller manager gave it a CIDR) are skipped until they have both.
pub fn wanted_routes(nodes: &[&Node], own: &str) -> Routes {
    nodes
        .iter()
        .filter(|n| n.metadata.name != own)
        .filter_map(|n| Some((n.pod_cidr_v4()?, n.internal_ipv4()?)))
        .collect()
}

/// Why a node missing from `nodes` may still exist: an empty list, or one without this very
/// node, is a broken source (a wrong --node, a truncated file) rather than an empty cluster.
pub fn doubt(nodes: &[&Node], own: &str) -> Option<String> {
    if nodes.is_empty() {
        Some("the node list is empty".into())
    } else if !nodes.iter().any(|n| n.metadata.name == own) {
        Some(format!("this node ({own}) is not in the node list"))
    } else {
        None
    }
}

/// Which of our routes to destinations nobody wants any more may go.
pub enum Prune<'a> {
    /// All of them: the node list is complete.
    All,
    /// Only those of nodes known to be deleted.
    Only(&'a BTreeSet<Ipv4Network>),
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub add: Vec<(Ipv4Network, Ipv4Addr)>,
    /// Our route to the destination, with its new gateway.
    pub change: Vec<(Ipv4Network, Ipv4Addr)>,
    pub remove: Vec<(Ipv4Network, Ipv4Addr)>,
    /// Wanted, but someone else's route to the same destination is there: (dst, gw, that route).
    pub blocked: Vec<(Ipv4Network, Ipv4Addr, String)>,
    /// Ours, not wanted, but not known to be unwanted either (see [`Prune`]).
    pub kept: Vec<Ipv4Network>,
}

pub fn plan(wanted: &Routes, present: &MainRoutes, prune: Prune) -> Plan {
    let mut plan = Plan::default();
    for (&dst, &gw) in wanted {
        // Someone else's route to the destination wins: theirs is deliberate, and replacing it
        // would hide that; our own route there, if any, stays as it is too.
        if let Some(route) = present.foreign.get(&dst) {
            plan.blocked.push((dst, gw, route.clone()));
            continue;
        }
        match present.ours.get(&dst) {
            None => plan.add.push((dst, gw)),
            Some(old) if *old != gw => plan.change.push((dst, gw)),
            Some(_) => {}
        }
    }
    for (&dst, &gw) in &present.ours {
        if wanted.contains_key(&dst) {
            continue;
        }
        match prune {
            Prune::Only(deleted) if !deleted.contains(&dst) => plan.kept.push(dst),
            _ => plan.remove.push((dst, gw)),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Network {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn present() -> MainRoutes {
        MainRoutes {
            ours: [
                (net("10.1.2.0/24"), ip("192.168.0.2")),
                (net("10.1.3.0/24"), ip("192.168.0.3")),
                (net("10.1.4.0/24"), ip("192.168.0.4")),
            ]
            .into(),
            foreign: [
                (net("10.1.5.0/24"), "10.1.5.0/24 via 192.168.0.9 proto static".into()),
                (net("192.168.0.0/24"), "192.168.0.0/24 proto kernel".into()),
            ]
            .into(),
        }
    }

    #[test]
    fn adds_changes_removes_and_leaves_foreign_routes_alone() {
        let wanted = [
            (net("10.1.2.0/24"), ip("192.168.0.2")),  // as it is
            (net("10.1.3.0/24"), ip("192.168.0.33")), // new gateway
            (net("10.1.5.0/24"), ip("192.168.0.5")),  // someone else's route is there
            (net("10.1.6.0/24"), ip("192.168.0.6")),  // new
        ]
        .into();
        let plan = plan(&wanted, &present(), Prune::All);
        assert_eq!(
            plan,
            Plan {
                add: vec![(net("10.1.6.0/24"), ip("192.168.0.6"))],
                change: vec![(net("10.1.3.0/24"), ip("192.168.0.33"))],
                remove: vec![(net("10.1.4.0/24"), ip("192.168.0.4"))],
                blocked: vec![(
                    net("10.1.5.0/24"),
                    ip("192.168.0.5"),
                    "10.1.5.0/24 via 192.168.0.9 proto static".into()
                )],
                kept: vec![],
            }
        );
    }

    #[test]
    fn an_incomplete_list_removes_only_deleted_nodes() {
        let deleted = [net("10.1.3.0/24")].into();
        let plan = plan(&Routes::new(), &present(), Prune::Only(&deleted));
        assert_eq!(plan.remove, [(net("10.1.3.0/24"), ip("192.168.0.3"))]);
        assert_eq!(plan.kept, [net("10.1.2.0/24"), net("10.1.4.0/24")]);
        assert!(plan.add.is_empty() && plan.change.is_empty() && plan.blocked.is_empty());
    }

    #[test]
    fn our_route_to_a_blocked_destination_stays() {
        let mut present = present();
        present.foreign.insert(net("10.1.2.0/24"), "10.1.2.0/24 via 192.168.0.7 proto boot".into());
        let wanted = [(net("10.1.2.0/24"), ip("192.168.0.22"))].into();
        let plan = plan(&wanted, &present, Prune::Only(&BTreeSet::new()));
        assert!(plan.change.is_empty() && plan.remove.is_empty());
        assert_eq!(plan.blocked.len(), 1);
    }

    #[test]
    fn which_lists_may_remove() {
        let node =
            |name: &str| -> Node { serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap() };
        let (a, b) = (node("a"), node("b"));
        assert_eq!(doubt(&[], "a").unwrap(), "the node list is empty");
        assert_eq!(doubt(&[&b], "a").unwrap(), "this node (a) is not in the node list");
        assert_eq!(doubt(&[&a, &b], "a"), None);
    }
}
