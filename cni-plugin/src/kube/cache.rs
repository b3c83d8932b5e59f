//! The agent's picture of the cluster's nodes: one list, then the watch's events applied to it.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result, bail};
use ipnetwork::{Ipv4Network, Ipv6Network};

use super::{Node, NodeList, watch::Event};

pub struct NodeCache {
    nodes: BTreeMap<String, Node>,
    /// Where the next watch resumes: the newest version seen in the list or any event.
    resource_version: String,
}

/// What an event meant for the agent.
#[derive(Debug)]
pub enum Change {
    /// Nothing a route depends on (a status update, a bookmark).
    None,
    /// A node came, or its pod CIDR or address changed.
    Nodes,
    /// A node is gone: its state as the agent knew it.
    Deleted(Node),
    /// The watch cannot resume (the version aged out): only a new list can go on.
    Relist(String),
}

impl NodeCache {
    pub fn new(list: NodeList) -> Result<Self> {
        let resource_version = list
            .metadata
            .resource_version
            .filter(|v| !v.is_empty())
            .context("the node list has no resourceVersion to watch from")?;
        let nodes = list.items.into_iter().map(|n| (n.metadata.name.clone(), n)).collect();
        Ok(Self { nodes, resource_version })
    }

    pub fn nodes(&self) -> Vec<&Node> {
        self.nodes.values().collect()
    }

    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// Takes one event in. An error event other than "too old" is an error: the caller resumes
    /// the watch later from the last version seen.
    pub fn apply(&mut self, event: Event) -> Result<Change> {
        match event {
            Event::Added(node) | Event::Modified(node) => {
                self.seen(&node);
                // Nodes update their status often; only what routes are made of calls for a sync.
                let changed = self.nodes.get(&node.metadata.name).is_none_or(|old| route_of(old) != route_of(&node));
                self.nodes.insert(node.metadata.name.clone(), node);
                Ok(if changed { Change::Nodes } else { Change::None })
            }
            Event::Deleted(node) => {
                self.seen(&node);
                // The cached state is what the node's route was made from.
                Ok(Change::Deleted(self.nodes.remove(&node.metadata.name).unwrap_or(node)))
            }
            Event::Bookmark(version) => {
                self.resource_version = version;
                Ok(Change::None)
            }
            Event::Error { code: Some(410), message } => Ok(Change::Relist(message)),
            Event::Error { code, message } => {
                bail!("the API server ended the watch: {message} (code {})", code.unwrap_or_default())
            }
        }
    }

    fn seen(&mut self, node: &Node) {
        if let Some(version) = node.metadata.resource_version.as_ref().filter(|v| !v.is_empty()) {
            self.resource_version.clone_from(version);
        }
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
    use crate::kube::watch::parse;

    fn event(kind: &str, name: &str, version: &str, cidr: &str) -> Event {
        parse(&format!(
            r#"{{"type":"{kind}","object":{{"metadata":{{"name":"{name}","resourceVersion":"{version}"}},
                "spec":{{"podCIDR":"{cidr}"}},"status":{{"addresses":[{{"type":"InternalIP","address":"10.0.0.1"}}]}}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn follows_the_events() {
        let list = r#"{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a"}}]}"#;
        let mut cache = NodeCache::new(serde_json::from_str(list).unwrap()).unwrap();
        assert_eq!(cache.resource_version(), "5");
        assert!(matches!(cache.apply(event("ADDED", "b", "6", "10.1.0.0/24")).unwrap(), Change::Nodes));
        assert!(matches!(cache.apply(event("MODIFIED", "b", "7", "10.1.0.0/24")).unwrap(), Change::None));
        assert!(matches!(cache.apply(event("MODIFIED", "b", "8", "10.2.0.0/24")).unwrap(), Change::Nodes));
        assert_eq!(cache.resource_version(), "8");
        let Change::Deleted(b) = cache.apply(event("DELETED", "b", "9", "10.9.0.0/24")).unwrap() else { panic!() };
        assert_eq!(b.pod_cidr_v4().unwrap().to_string(), "10.2.0.0/24", "the route was made from the cached state");
        assert_eq!(cache.nodes().iter().map(|n| n.metadata.name.as_str()).collect::<Vec<_>>(), ["a"]);
        cache.apply(parse(r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}}"#).unwrap()).unwrap();
        assert_eq!(cache.resource_version(), "12");
    }

    #[test]
    fn an_ipv6_change_alone_calls_for_a_sync() {
        let list = r#"{"metadata":{"resourceVersion":"5"},"items":[]}"#;
        let mut cache = NodeCache::new(serde_json::from_str(list).unwrap()).unwrap();
        let dual = |version: &str, ipv6: &str| {
            parse(&format!(
                r#"{{"type":"MODIFIED","object":{{"metadata":{{"name":"b","resourceVersion":"{version}"}},
                    "spec":{{"podCIDRs":["10.1.0.0/24","fd00:1::/64"]}},"status":{{"addresses":[
                    {{"type":"InternalIP","address":"10.0.0.1"}},{{"type":"InternalIP","address":"{ipv6}"}}]}}}}}}"#
            ))
            .unwrap()
        };
        assert!(matches!(cache.apply(dual("6", "fd00::1")).unwrap(), Change::Nodes));
        assert!(matches!(cache.apply(dual("7", "fd00::1")).unwrap(), Change::None));
        assert!(matches!(cache.apply(dual("8", "fd00::11")).unwrap(), Change::Nodes), "the IPv6 gateway moved");
    }

    #[test]
    fn too_old_means_relist_and_other_errors_fail() {
        let mut cache =
            NodeCache::new(serde_json::from_str(r#"{"metadata":{"resourceVersion":"5"},"items":[]}"#).unwrap())
                .unwrap();
        let gone = parse(r#"{"type":"ERROR","object":{"code":410,"message":"too old resource version"}}"#).unwrap();
        assert!(matches!(cache.apply(gone).unwrap(), Change::Relist(m) if m == "too old resource version"));
        let other = parse(r#"{"type":"ERROR","object":{"code":500,"message":"etcd is sad"}}"#).unwrap();
        assert!(cache.apply(other).unwrap_err().to_string().contains("etcd is sad (code 500)"));
        assert_eq!(cache.resource_version(), "5");
    }

    #[test]
    fn a_list_without_a_version_cannot_be_watched() {
        assert!(NodeCache::new(serde_json::from_str(r#"{"items":[]}"#).unwrap()).is_err());
    }
}
