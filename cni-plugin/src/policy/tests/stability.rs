//! Identities and slots stay put across recompiles; the diff is what changed.
use serde_json::json;

use super::{World, v4};
use crate::policy::Changes;

#[test]
fn identities_and_slots_are_stable() {
    let mut w = World::xyz();
    w.add("x", "one", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    w.add("x", "two", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    let before = w.out.clone();
    w.compile();
    assert_eq!(w.out, before, "the same input compiles the same");
    let (slot_two, id_b) = (w.compiler.slot("x", "two"), w.identity(v4("y/b")));
    w.input.policies.remove(&("x".to_string(), "one".to_string()));
    let a = (v4("y/a").to_string(), super::v6("y/a").to_string());
    w.input.apply_pod(&super::pod("y", "a", json!({"pod": "a", "new": "label"}), &[&a.0, &a.1]));
    w.compile();
    assert_eq!(w.compiler.slot("x", "two"), slot_two);
    assert_eq!(w.identity(v4("y/b")), id_b);
    let changes = Changes::between(&before, &w.out);
    // y/a's two addresses changed identity; nothing else did.
    assert_eq!(changes.identities.write.len(), 2, "{changes:?}");
    assert!(changes.identities.remove.is_empty());
    w.add("x", "three", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    assert_eq!(w.compiler.slot("x", "three"), 1, "the first free slot");
}

#[test]
fn a_fresh_compiler_numbers_the_same_input_the_same() {
    let mut w = World::xyz();
    w.add("x", "p", json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]}]}));
    // As a restarted agent would: no history, the same numbers.
    let (mut one, mut other) = (super::Compiler::default(), super::Compiler::default());
    assert_eq!(one.compile(&w.input), other.compile(&w.input));
}

#[test]
fn diff_writes_changed_and_removes_gone() {
    let mut w = World::xyz();
    let empty = w.out.clone();
    w.add(
        "x",
        "p",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {}}]}]}),
    );
    let on = w.out.clone();
    let changes = Changes::between(&empty, &on);
    assert_eq!(changes.rules.write.len(), on.rules.len());
    assert_eq!(changes.endpoints.write.len(), 1, "x/a became isolated");
    w.input.policies.clear();
    w.compile();
    let changes = Changes::between(&on, &w.out);
    assert_eq!(changes.rules.remove.len(), on.rules.len());
    assert!(changes.rules.write.is_empty());
    assert_eq!(changes.endpoints.write.len(), 1);
}
