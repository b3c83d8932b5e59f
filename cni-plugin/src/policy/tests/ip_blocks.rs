//! `ipBlock` with `except`, on pod addresses (as upstream's e2e cases) and outside addresses.
use ebpf_common::{IDENTITY_HOST, IDENTITY_WORLD};
use serde_json::json;

use super::{NODE, TCP, World, prefix, v4, v6};

#[test]
fn except_takes_out_one_pod() {
    let mut w = World::xyz();
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
        {"ipBlock": {"cidr": "10.0.0.0/16", "except": [format!("{}/32", v4("y/b"))]}}]}]});
    w.add("x", "p", spec);
    w.check_families(TCP, 80, false, &|from, to| to != "x/a" || from != "y/b");
    // The IPv6 addresses are in no IPv4 block: denied.
    assert!(!w.allows_addr(v6("y/c"), v6("x/a"), TCP, 80));
    // Every boundary is an entry; the except's /32 is the pod's own identity.
    assert!(w.out.identities.contains_key(&prefix("10.0.0.0/16")));
    assert_ne!(w.identity(v4("y/b")), w.identity(v4("y/c")));
}

#[test]
fn egress_to_outside_addresses() {
    let mut w = World::xyz();
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{"to": [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "203.0.113.0/24"]}},
        {"ipBlock": {"cidr": "203.0.113.128/25"}},
        {"ipBlock": {"cidr": "2001:db8::/32"}}]}]});
    w.add("x", "p", spec);
    let out = |addr: &str| w.allows_addr(v4("x/a"), addr.parse().unwrap(), TCP, 443);
    assert!(out("8.8.8.8"));
    assert!(!out("10.1.2.3"));
    assert!(!out("203.0.113.5"), "in an except");
    assert!(out("203.0.113.200"), "in the except, but in another block");
    assert!(!w.allows_addr(v4("x/a"), v4("y/b"), TCP, 80), "pods are in 10/8");
    assert!(w.allows_addr(v6("x/a"), "2001:db8::1".parse().unwrap(), TCP, 80));
    assert!(!w.allows_addr(v6("x/a"), "2001:db9::1".parse().unwrap(), TCP, 80));
    assert!(w.allows_addr(v4("x/b"), "10.1.2.3".parse().unwrap(), TCP, 80), "x/b is not isolated");
    // An address in no block is WORLD; a v6 one too.
    assert_eq!(w.identity("2001:db9::1".parse().unwrap()), IDENTITY_WORLD);
    assert_ne!(w.identity("8.8.8.8".parse().unwrap()), IDENTITY_WORLD, "in 0.0.0.0/0 minus excepts");
}

#[test]
fn the_node_is_a_peer_of_blocks_holding_its_address() {
    let mut w = World::xyz();
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{"to": [
        {"ipBlock": {"cidr": "192.168.0.0/24"}}]}]});
    w.add("x", "p", spec);
    assert_eq!(w.identity(NODE.parse().unwrap()), IDENTITY_HOST);
    assert!(w.allows_addr(v4("x/a"), NODE.parse().unwrap(), TCP, 10250));
    assert!(w.allows_addr(v4("x/a"), "192.168.0.11".parse().unwrap(), TCP, 10250));
    assert!(!w.allows_addr(v4("x/a"), "192.168.1.11".parse().unwrap(), TCP, 10250));
}
