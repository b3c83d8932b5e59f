//! Invalid or odd input: a line each, no panic, and never a verdict for another pod.
use serde_json::json;

use super::{TCP, World};

#[test]
fn an_invalid_subject_selector_ignores_the_policy() {
    let mut w = World::xyz();
    let spec =
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Bogus"}]}, "policyTypes": ["Ingress"]});
    w.add("x", "bad", spec);
    w.check(TCP, 80, |_, _| true);
    assert_eq!(w.out.problems.len(), 1, "{:?}", w.out.problems);
}

#[test]
fn invalid_peers_and_ports_allow_nothing_more() {
    let mut w = World::xyz();
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]},
        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["nonsense"]}}]},
        {"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In"}]}}]},
        {"from": [{}]},
        {"ports": [{"port": 80, "protocol": "ICMP"}]},
        {"ports": [{"port": 90, "endPort": 85}]}]});
    w.add("x", "bad", spec);
    w.check(TCP, 80, |_, to| to != "x/a");
    assert_eq!(w.out.problems.len(), 6, "{:?}", w.out.problems);
}

#[test]
fn a_policy_in_an_unknown_namespace_still_isolates_its_pods() {
    let mut w = World::xyz();
    w.input.namespaces.remove("x");
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    w.check(TCP, 80, |_, to| !to.starts_with("x/"));
    assert!(w.out.problems.iter().any(|p| p.contains("unknown")), "{:?}", w.out.problems);
    // A namespace with no pod at all: nothing to enforce, said.
    w.add("nowhere", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    w.check(TCP, 80, |_, to| !to.starts_with("x/"));
    assert!(w.out.unmatched.contains(&"nowhere/deny".to_string()));
}

#[test]
fn a_selector_that_matches_nothing_changes_nothing() {
    let mut w = World::xyz();
    w.add("x", "p", json!({"podSelector": {"matchLabels": {"pod": "nobody"}}, "policyTypes": ["Ingress"]}));
    w.check(TCP, 80, |_, _| true);
    assert_eq!(w.out.unmatched, vec!["x/p".to_string()]);
}

#[test]
fn ten_thousand_rules() {
    let mut w = World::xyz();
    let rules: Vec<_> = (0..10_000)
        .map(|i| json!({"from": [{"ipBlock": {"cidr": format!("172.{}.{}.0/24", 16 + i / 256, i % 256)}}], "ports": [{"port": 1000 + i % 1000}]}))
        .collect();
    let started = std::time::Instant::now();
    w.add("x", "big", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": rules}));
    // Blocks are found through an index: 10,000 of them must not cost 10,000² checks.
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    w.check(TCP, 80, |_, to| to != "x/a");
    let allowed = |addr: &str, port| w.allows_addr(addr.parse().unwrap(), super::v4("x/a"), TCP, port);
    assert!(allowed("172.16.5.9", 1005));
    assert!(!allowed("172.16.5.9", 1006));
    assert!(w.out.rules.len() >= 10_000);
    assert!(w.out.problems.is_empty());
}

#[test]
fn two_pods_claiming_one_address() {
    let mut w = World::xyz();
    let ip = super::v4("x/a").to_string();
    w.input.apply_pod(&super::pod("y", "impostor", json!({"pod": "b"}), &[&ip]));
    w.add("x", "p", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}));
    assert!(w.out.problems.iter().any(|p| p.contains("both have")), "{:?}", w.out.problems);
}
