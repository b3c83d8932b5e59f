//! The parts of a Kubernetes Node object the installer and the agent read: its name, its pod
//! CIDR and its internal address; and the resource versions a watch resumes from.
use std::net::Ipv4Addr;

use ipnetwork::Ipv4Network;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct NodeList {
    /// The list's resource version: where a watch of the changes since the list starts.
    #[serde(default)]
    pub metadata: ListMeta,
    pub items: Vec<Node>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    pub resource_version: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Node {
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default)]
    pub status: Status,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub name: String,
    pub resource_version: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    /// Dual-stack clusters list one CIDR per family here; `podCIDR` is the first of them.
    #[serde(rename = "podCIDRs", default)]
    pub pod_cidrs: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Status {
    #[serde(default)]
    pub addresses: Vec<Address>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Address {
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
}

impl Node {
    /// The node's IPv4 pod CIDR (from `podCIDRs`, else `podCIDR`), if it has one.
    pub fn pod_cidr_v4(&self) -> Option<Ipv4Network> {
        self.spec.pod_cidrs.iter().chain(&self.spec.pod_cidr).find_map(|c| c.parse::<Ipv4Network>().ok())
    }

    /// The node's IPv4 `InternalIP`: where other nodes send its pods' traffic (host-gw).
    pub fn internal_ipv4(&self) -> Option<Ipv4Addr> {
        self.status.addresses.iter().filter(|a| a.kind == "InternalIP").find_map(|a| a.address.parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_api_server_sends() {
        let list: NodeList = serde_json::from_str(
            r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[
                {"metadata":{"name":"a","labels":{}},"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["fd00:1::/64","10.244.1.0/24"]},
                 "status":{"addresses":[{"type":"Hostname","address":"a"},{"type":"InternalIP","address":"fd00::1"},
                                        {"type":"InternalIP","address":"192.168.1.10"}]}},
                {"metadata":{"name":"b"},"spec":{},"status":{}}]}"#,
        )
        .unwrap();
        assert_eq!(list.metadata.resource_version.as_deref(), Some("7"));
        let a = &list.items[0];
        assert_eq!(a.pod_cidr_v4().unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(a.internal_ipv4(), Some(Ipv4Addr::new(192, 168, 1, 10)));
        assert_eq!((list.items[1].pod_cidr_v4(), list.items[1].internal_ipv4()), (None, None), "not yet allocated");
    }
}
