//! What one sync should do to the routes: a pure function of the routes wanted (from the nodes)
//! and the routes present, ours and everyone else's. Both families go through the same plan:
//! an IPv4 destination never meets an IPv6 one, and the rules are the same for each.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ipnetwork::IpNetwork;

use crate::{
    kube::{Node, NodeExt as _},
    net::routes::MainRoutes,
};

/// Destination → gateway.
pub type Routes = BTreeMap<IpNetwork, IpAddr>;

/// Every other node's pod CIDR via its InternalIP, per family: IPv4 via the IPv4 address, IPv6
/// via the IPv6 one. A family the node lacks either of yet (a new node before the controller
/// manager gave it a CIDR, a single-stack node) gets no route until it has both.
pub fn wanted_routes(nodes: &[&Node], own: &str) -> Routes {
    nodes.iter().filter(|n| n.node_name() != own).flat_map(|n| node_routes(n)).collect()
}

/// A node's routes: one per family it has both a pod CIDR and an InternalIP of.
fn node_routes(node: &Node) -> impl Iterator<Item = (IpNetwork, IpAddr)> {
    let v4 = node.pod_cidr_v4().zip(node.internal_ipv4()).map(|(c, ip)| (c.into(), ip.into()));
    let v6 = node.pod_cidr_v6().zip(node.internal_ipv6()).map(|(c, ip)| (c.into(), ip.into()));
    v4.into_iter().chain(v6)
}

/// The destinations a deleted node's routes had: what may go even when the rest is in doubt.
pub fn pod_cidrs(node: &Node) -> impl Iterator<Item = IpNetwork> {
    node.pod_cidr_v4().map(IpNetwork::from).into_iter().chain(node.pod_cidr_v6().map(IpNetwork::from))
}

/// Why a node missing from `nodes` may still exist: an empty list, or one without this very
/// node, is a broken source (a wrong --node, a truncated file) rather than an empty cluster.
pub fn doubt(nodes: &[&Node], own: &str) -> Option<String> {
    if nodes.is_empty() {
        Some("the node list is empty".into())
    } else if !nodes.iter().any(|n| n.node_name() == own) {
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
    Only(&'a BTreeSet<IpNetwork>),
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub add: Vec<(IpNetwork, IpAddr)>,
    /// Our route to the destination, with its new gateway.
    pub change: Vec<(IpNetwork, IpAddr)>,
    pub remove: Vec<(IpNetwork, IpAddr)>,
    /// Wanted, but someone else's route to the same destination is there: (dst, gw, that route).
    pub blocked: Vec<(IpNetwork, IpAddr, String)>,
    /// Ours, not wanted, but not known to be unwanted either (see [`Prune`]).
    pub kept: Vec<IpNetwork>,
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

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
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

    fn dual_stack_node(name: &str, cidrs: &[&str], ips: &[&str]) -> Node {
        let addresses: Vec<_> = ips.iter().map(|ip| serde_json::json!({"type": "InternalIP", "address": ip})).collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
            "status": {"addresses": addresses},
        }))
        .unwrap()
    }

    #[test]
    fn each_family_routes_via_the_address_of_its_family() {
        let nodes = [
            dual_stack_node("a", &["10.1.1.0/24", "fd00:1:1::/64"], &["192.168.0.1", "fd00::1"]),
            // IPv6 listed first, as in an IPv6-first cluster.
            dual_stack_node("b", &["fd00:1:2::/64", "10.1.2.0/24"], &["fd00::2", "192.168.0.2"]),
            // An IPv6 pod CIDR but no IPv6 address: IPv4 only, and the other way round.
            dual_stack_node("c", &["10.1.3.0/24", "fd00:1:3::/64"], &["192.168.0.3"]),
            dual_stack_node("d", &["fd00:1:4::/64"], &["192.168.0.4", "fd00::4"]),
        ];
        let wanted = wanted_routes(&nodes.iter().collect::<Vec<_>>(), "a");
        let want: Routes = [
            (net("10.1.2.0/24"), ip("192.168.0.2")),
            (net("10.1.3.0/24"), ip("192.168.0.3")),
            (net("fd00:1:2::/64"), ip("fd00::2")),
            (net("fd00:1:4::/64"), ip("fd00::4")),
        ]
        .into();
        assert_eq!(wanted, want);
        assert_eq!(pod_cidrs(&nodes[1]).collect::<Vec<_>>(), [net("10.1.2.0/24"), net("fd00:1:2::/64")]);
    }

    fn present_dual_stack() -> MainRoutes {
        let mut present = present();
        present.ours.extend([
            (net("fd00:1:2::/64"), ip("fd00::2")),
            (net("fd00:1:3::/64"), ip("fd00::3")),
            (net("fd00:1:4::/64"), ip("fd00::4")),
        ]);
        present.foreign.extend([
            (net("fd00:1:5::/64"), "fd00:1:5::/64 via fd00::9 proto static".to_string()),
            (net("fe80::/64"), "fe80::/64 proto kernel".to_string()),
        ]);
        present
    }

    #[test]
    fn ipv6_routes_follow_the_same_rules() {
        let wanted = [
            (net("10.1.2.0/24"), ip("192.168.0.2")),
            (net("10.1.3.0/24"), ip("192.168.0.3")),
            (net("10.1.4.0/24"), ip("192.168.0.4")),
            (net("fd00:1:2::/64"), ip("fd00::2")),  // as it is
            (net("fd00:1:3::/64"), ip("fd00::33")), // new gateway
            (net("fd00:1:5::/64"), ip("fd00::5")),  // someone else's route is there
            (net("fd00:1:6::/64"), ip("fd00::6")),  // new
        ]
        .into();
        let plan = plan(&wanted, &present_dual_stack(), Prune::All);
        assert_eq!(
            plan,
            Plan {
                add: vec![(net("fd00:1:6::/64"), ip("fd00::6"))],
                change: vec![(net("fd00:1:3::/64"), ip("fd00::33"))],
                remove: vec![(net("fd00:1:4::/64"), ip("fd00::4"))],
                blocked: vec![(net("fd00:1:5::/64"), ip("fd00::5"), "fd00:1:5::/64 via fd00::9 proto static".into())],
                kept: vec![],
            }
        );
    }

    #[test]
    fn a_deleted_dual_stack_node_loses_both_routes_even_from_an_incomplete_list() {
        let deleted = [net("10.1.3.0/24"), net("fd00:1:3::/64")].into();
        let plan = plan(&Routes::new(), &present_dual_stack(), Prune::Only(&deleted));
        assert_eq!(plan.remove, [(net("10.1.3.0/24"), ip("192.168.0.3")), (net("fd00:1:3::/64"), ip("fd00::3"))]);
        let kept = ["10.1.2.0/24", "10.1.4.0/24", "fd00:1:2::/64", "fd00:1:4::/64"].map(net);
        assert_eq!(plan.kept, kept);
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
