//! `ports`: numbers, protocols, named ports (each direction's own resolution) and `endPort`.
use serde_json::json;

use super::{SCTP, TCP, UDP, World};

fn only_a(ports: serde_json::Value) -> serde_json::Value {
    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": ports}]})
}

#[test]
fn a_port_number_defaults_to_tcp() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": 80}])));
    w.check(TCP, 80, |_, _| true);
    w.check(TCP, 81, |_, to| to != "x/a");
    w.check(UDP, 80, |_, to| to != "x/a");
}

#[test]
fn udp_and_sctp() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": 81, "protocol": "UDP"}, {"protocol": "SCTP"}])));
    w.check(UDP, 81, |_, _| true);
    w.check(UDP, 80, |_, to| to != "x/a");
    w.check(SCTP, 80, |_, _| true);
    w.check(SCTP, 81, |_, _| true);
    w.check(TCP, 81, |_, to| to != "x/a");
}

#[test]
fn named_ingress_port_is_the_subject_s() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": "serve-81-udp", "protocol": "UDP"}])));
    w.check(UDP, 81, |_, _| true);
    w.check(UDP, 80, |_, to| to != "x/a");
    w.check(TCP, 81, |_, to| to != "x/a");
    // A name the subject lacks allows nothing.
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": "no-such-port"}])));
    w.check(TCP, 80, |_, to| to != "x/a");
    // The name with another protocol than the container port's: nothing.
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": "serve-80-tcp", "protocol": "UDP"}])));
    w.check(UDP, 80, |_, to| to != "x/a");
}

#[test]
fn named_egress_port_is_the_peer_s() {
    let mut w = World::xyz();
    // y/b names its port 80 "web" on 8080 instead.
    let mut pod =
        super::pod("y", "b", json!({"pod": "b"}), &[&super::v4("y/b").to_string(), &super::v6("y/b").to_string()]);
    let container = &mut pod.spec.as_mut().unwrap().containers[0];
    container
        .ports
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(json!({"name": "web", "containerPort": 8080})).unwrap());
    w.input.apply_pod(&pod);
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "web"}]}]});
    w.add("x", "p", spec);
    w.check(TCP, 8080, |from, to| from != "x/a" || to == "y/b");
    w.check(TCP, 80, |from, _| from != "x/a");
    // An ipBlock peer's named port: only pods in the block that have the name.
    let spec = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "serve-81-tcp"}]}]});
    w.add("x", "p", spec);
    w.check_families(TCP, 81, false, &|_, _| true);
    w.check_families(TCP, 80, false, &|from, _| from != "x/a");
}

#[test]
fn end_port_ranges() {
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": 79, "endPort": 80}])));
    w.check(TCP, 79, |_, _| true);
    w.check(TCP, 80, |_, _| true);
    w.check(TCP, 81, |_, to| to != "x/a");
    let mut w = World::xyz();
    w.add("x", "p", only_a(json!([{"port": 1000, "endPort": 33000, "protocol": "UDP"}])));
    for (port, open) in [(999, false), (1000, true), (4096, true), (32768, true), (33000, true), (33001, false)] {
        assert_eq!(w.allows("y/a", "x/a", UDP, port), open, "{port}");
    }
}
