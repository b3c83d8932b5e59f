//! The agent's picture of the cluster's nodes: a complete list, then the watch's changes applied
//! to it.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnetwork::{Ipv4Network, Ipv6Network};

use super::{Node, NodeExt};

pub struct NodeCache {
    nodes: BTreeMap<String, Node>,
}

impl NodeCache {
    pub fn new(list: Vec<Node>) -> Self {
        Self { nodes: list.into_iter().map(|n| (n.node_name().to_string(), n)).collect() }
    }

    pub fn nodes(&self) -> Vec<&Node> {
        self.nodes.values().collect()
    }

    pub fn get(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// A node came or changed: whether anything its routes are made of changed (nodes update
    /// their status often; only a route's inputs call for a sync).
    pub fn apply(&mut self, node: Node) -> bool {
        let name = node.node_name().to_string();
        let changed = self.nodes.get(&name).is_none_or(|old| route_of(old) != route_of(&node));
        self.nodes.insert(name, node);
        changed
    }

    /// A node is gone: its state as the agent knew it (what its routes were made from).
    pub fn delete(&mut self, node: Node) -> Node {
        self.nodes.remove(node.node_name()).unwrap_or(node)
    }
}

/// What of a node its routes (one per family) depend on.
type RouteInputs = (Option<Ipv4Network>, Option<Ipv4Addr>, Option<Ipv6Network>, Option<Ipv6Addr>);

fn route_of(node: &Node) -> RouteInputs {
    (node.pod_cidr_v4(), node.internal_ipv4(), node.pod_cidr_v6(), node.internal_ipv6())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str, ips: &[&str]) -> Node {
        let addresses: Vec<_> = ips.iter().map(|ip| serde_json::json!({"type": "InternalIP", "address": ip})).collect();
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "spec": {"podCIDRs": [cidr, "fd00:1::/64"]},
                                                   "status": {"addresses": addresses}}),
        )
        .unwrap()
    }

    #[test]
    fn follows_the_changes() {
        let mut cache = NodeCache::new(vec![node("a", "10.0.0.0/24", &["10.0.0.1"])]);
        assert!(cache.apply(node("b", "10.1.0.0/24", &["10.0.0.2"])));
        assert!(!cache.apply(node("b", "10.1.0.0/24", &["10.0.0.2"])), "a status update");
        assert!(cache.apply(node("b", "10.2.0.0/24", &["10.0.0.2"])));
        assert!(cache.apply(node("b", "10.2.0.0/24", &["10.0.0.2", "fd00::2"])), "an IPv6 address alone");
        assert!(cache.apply(node("b", "10.2.0.0/24", &["10.0.0.2", "fd00::12"])), "the IPv6 gateway moved");
        let b = cache.delete(node("b", "10.9.0.0/24", &[]));
        assert_eq!(b.pod_cidr_v4().unwrap().to_string(), "10.2.0.0/24", "the route was made from the cached state");
        assert_eq!(cache.nodes().iter().map(|n| n.node_name()).collect::<Vec<_>>(), ["a"]);
    }
}
