//! Peers by pod and namespace selectors, alone, together (AND) and side by side (OR).
use serde_json::json;

use super::{TCP, UDP, World};

fn only_a(from: serde_json::Value) -> serde_json::Value {
    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": from}]})
}

#[test]
fn pod_selector_is_the_policy_namespace() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"podSelector": {"matchLabels": {"pod": "b"}}}])));
    w.check(TCP, 80, |from, to| to != "x/a" || from == "x/b");
}

#[test]
fn namespace_selector_is_every_pod_there() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}])));
    w.check(TCP, 80, |from, to| to != "x/a" || from.starts_with("y/"));
    // `namespaceSelector: {}`: every pod of every namespace.
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"namespaceSelector": {}}])));
    w.check(TCP, 80, |_, _| true);
}

#[test]
fn both_in_one_peer_is_and() {
    let mut w = World::xyz();
    let peer =
        json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]);
    w.add("x", "p", only_a(peer));
    w.check(TCP, 80, |from, to| to != "x/a" || from == "y/b");
}

#[test]
fn separate_peers_are_or() {
    let mut w = World::xyz();
    let peers =
        json!([{"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": {"matchLabels": {"pod": "b"}}}]);
    w.add("x", "p", only_a(peers));
    w.check(UDP, 81, |from, to| to != "x/a" || from.starts_with("y/") || from == "x/b");
}

#[test]
fn match_expressions_in_subjects_and_peers() {
    let mut w = World::xyz();
    let spec = json!({
        "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
        "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x", "y"]}]},
                              "podSelector": {"matchExpressions": [{"key": "pod", "operator": "Exists"}]}}]}],
    });
    w.add("x", "p", spec);
    w.check(TCP, 80, |from, to| !(to == "x/a" || to == "x/b") || from.starts_with("z/"));
    let mut w = World::xyz();
    let spec = json!({
        "podSelector": {"matchExpressions": [{"key": "pod", "operator": "DoesNotExist"}]},
        "policyTypes": ["Ingress"],
    });
    w.add("x", "none", spec);
    w.check(TCP, 80, |_, _| true);
}

#[test]
fn label_changes_move_pods_in_and_out() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"namespaceSelector": {"matchLabels": {"team": "blue"}}}])));
    w.check(TCP, 80, |_, to| to != "x/a");
    w.input.apply_namespace(&super::namespace("z", json!({"ns": "z", "team": "blue"})));
    w.compile();
    w.check(TCP, 80, |from, to| to != "x/a" || from.starts_with("z/"));
    let (a, b) = (super::v4("y/c").to_string(), super::v6("y/c").to_string());
    w.input.apply_pod(&super::pod("y", "c", json!({"pod": "a"}), &[&a, &b]));
    w.compile();
    // y/c now carries pod=a in y: not a subject (other namespace), and still not a peer.
    w.check(TCP, 80, |from, to| to != "x/a" || from.starts_with("z/"));
    let (a, b) = (super::v4("x/c").to_string(), super::v6("x/c").to_string());
    w.input.apply_pod(&super::pod("x", "c", json!({"pod": "a"}), &[&a, &b]));
    w.compile();
    w.check(TCP, 80, |from, to| !(to == "x/a" || to == "x/c") || from.starts_with("z/"));
}
