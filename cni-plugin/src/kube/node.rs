//! What the installer and the agent read of a Kubernetes Node (k8s-openapi's type): its name,
//! its pod CIDRs and its internal addresses, one of each per family.
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnetwork::{Ipv4Network, Ipv6Network};
pub use k8s_openapi::api::core::v1::Node;

/// `GET /api/v1/nodes`'s answer (a `NodeList`).
pub type NodeList = k8s_openapi::List<Node>;

pub trait NodeExt {
    fn node_name(&self) -> &str;
    /// The node's IPv4 pod CIDR (from `podCIDRs`, else `podCIDR`), if it has one.
    fn pod_cidr_v4(&self) -> Option<Ipv4Network>;
    /// The node's IPv6 pod CIDR (from `podCIDRs`, else `podCIDR`: an IPv6-first cluster names
    /// its IPv6 CIDR there), if it has one.
    fn pod_cidr_v6(&self) -> Option<Ipv6Network>;
    /// The node's IPv4 `InternalIP`: where other nodes send its pods' traffic (host-gw).
    fn internal_ipv4(&self) -> Option<Ipv4Addr>;
    /// The node's IPv6 `InternalIP`: a dual-stack node lists one `InternalIP` per family.
    fn internal_ipv6(&self) -> Option<Ipv6Addr>;
}

impl NodeExt for Node {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn pod_cidr_v4(&self) -> Option<Ipv4Network> {
        pod_cidr_texts(self).find_map(|c| c.parse().ok())
    }

    fn pod_cidr_v6(&self) -> Option<Ipv6Network> {
        pod_cidr_texts(self).find_map(|c| c.parse().ok())
    }

    fn internal_ipv4(&self) -> Option<Ipv4Addr> {
        internal_ips(self).find_map(|a| a.parse().ok())
    }

    fn internal_ipv6(&self) -> Option<Ipv6Addr> {
        internal_ips(self).find_map(|a| a.parse().ok())
    }
}

fn pod_cidr_texts(node: &Node) -> impl Iterator<Item = &String> {
    let spec = node.spec.as_ref();
    let cidrs = spec.and_then(|s| s.pod_cidrs.as_ref()).into_iter().flatten();
    cidrs.chain(spec.and_then(|s| s.pod_cidr.as_ref()))
}

fn internal_ips(node: &Node) -> impl Iterator<Item = &str> {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref()).into_iter().flatten();
    addresses.filter(|a| a.type_ == "InternalIP").map(|a| a.address.as_str())
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
        assert_eq!(a.node_name(), "a");
        assert_eq!(a.pod_cidr_v4().unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(a.internal_ipv4(), Some(Ipv4Addr::new(192, 168, 1, 10)));
        assert_eq!(a.pod_cidr_v6().unwrap().to_string(), "fd00:1::/64");
        assert_eq!(a.internal_ipv6(), Some("fd00::1".parse().unwrap()));
        let b = &list.items[1];
        assert_eq!((b.pod_cidr_v4(), b.internal_ipv4()), (None, None), "not yet allocated");
        assert_eq!((b.pod_cidr_v6(), b.internal_ipv6()), (None, None));
    }

    fn node(spec: serde_json::Value, addresses: &[(&str, &str)]) -> Node {
        let addresses: Vec<_> = addresses.iter().map(|(t, a)| serde_json::json!({"type": t, "address": a})).collect();
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": spec,
                                                   "status": {"addresses": addresses}}))
        .unwrap()
    }

    #[test]
    fn each_family_has_its_own_cidr_and_address() {
        // IPv6-first: podCIDR is the IPv6 CIDR, the IPv4 one only in podCIDRs.
        let n = node(
            serde_json::json!({"podCIDR": "fd00:2::/64", "podCIDRs": ["fd00:2::/64", "10.244.2.0/24"]}),
            &[("InternalIP", "fd00::2"), ("ExternalIP", "2001:db8::2"), ("InternalIP", "192.168.1.2")],
        );
        assert_eq!(n.pod_cidr_v4().unwrap().to_string(), "10.244.2.0/24");
        assert_eq!(n.pod_cidr_v6().unwrap().to_string(), "fd00:2::/64");
        assert_eq!(n.internal_ipv6(), Some("fd00::2".parse().unwrap()), "not the ExternalIP");
        // Only podCIDR (clusters before podCIDRs), single-stack IPv4: no IPv6 at all.
        let n = node(serde_json::json!({"podCIDR": "10.244.3.0/24"}), &[("InternalIP", "192.168.1.3")]);
        assert_eq!(n.pod_cidr_v4().unwrap().to_string(), "10.244.3.0/24");
        assert_eq!((n.pod_cidr_v6(), n.internal_ipv6()), (None, None));
        let n = node(serde_json::json!({"podCIDR": "fd00:4::/64"}), &[("ExternalIP", "fd00::4")]);
        assert_eq!((n.pod_cidr_v6().unwrap().to_string(), n.internal_ipv6()), ("fd00:4::/64".into(), None));
    }
}
