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

/// Two local pods whose host veths share a `POLICY_ENDPOINTS` slot: the lower ifindex keeps
/// the slot, the other goes by ifindex, each enforced; when the slot's pod goes, the other
/// moves into the slot and its by-ifindex entry is removed.
#[test]
fn pods_sharing_a_slot_both_get_their_entries() {
    use ebpf_common::{HOST_VETHS_SLOTS, host_veth_slot};
    let mut w = World::xyz();
    let (xa, xb) = (v4("x/a"), v4("x/b"));
    let low = w.input.locals[&xa];
    let high = crate::policy::Local { ifindex: low.ifindex + HOST_VETHS_SLOTS, owner: 77 };
    for addr in [xb, super::v6("x/b")] {
        w.input.locals.insert(addr, high);
    }
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    assert!(w.out.problems.is_empty(), "{:?}", w.out.problems);
    assert_eq!(w.out.endpoints[&host_veth_slot(low.ifindex)].ifindex, low.ifindex);
    assert_eq!(w.out.endpoints_by_ifindex.keys().copied().collect::<Vec<_>>(), [high.ifindex]);
    assert!(!w.allows("y/a", "x/a", super::TCP, 80), "x/a isolated");
    assert!(!w.allows("y/a", "x/b", super::TCP, 80), "x/b isolated too, by its own entry");
    let before = w.out.clone();
    w.input.locals.remove(&xa);
    w.input.locals.remove(&super::v6("x/a"));
    w.compile();
    let changes = Changes::between(&before, &w.out);
    assert_eq!(changes.endpoints.write.len(), 1, "x/b into the freed slot");
    assert_eq!(changes.endpoints.write[0].1.ifindex, high.ifindex);
    assert_eq!(changes.endpoints_by_ifindex.remove, [high.ifindex]);
    assert!(!w.allows("y/a", "x/b", super::TCP, 80));
}
