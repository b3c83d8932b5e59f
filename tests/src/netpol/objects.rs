//! The API's own JSON for what the cases write into the fake API server: Namespaces, Pods and
//! NetworkPolicies (`networking.k8s.io/v1`), with small helpers for the parts cases repeat.
use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::{
    expect::Peer,
    model::{ALL_TARGETS, PodRef, Target},
};

/// `{"k": "v", …}`.
pub fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<Map<_, _>>())
}

/// A Namespace labelled as upstream's tests label theirs: `ns: <name>` and the label the API
/// server sets itself, plus `extra`.
pub fn namespace(name: &str, extra: &[(&str, &str)]) -> Value {
    let mut l = labels(extra);
    l["ns"] = json!(name);
    l["kubernetes.io/metadata.name"] = json!(name);
    json!({ "metadata": { "name": name, "labels": l } })
}

/// A running pod on `node_name` with `addresses` (`status.podIPs`) and the labels `pod: <name>`
/// plus `extra`; one container serving the four targets under upstream's port names.
pub fn pod(p: PodRef, node_name: &str, addresses: &[IpAddr], extra: &[(&str, &str)]) -> Value {
    let mut l = labels(extra);
    l["pod"] = json!(p.name);
    let ports: Vec<Value> = ALL_TARGETS
        .iter()
        .map(|t| json!({ "name": t.port_name(), "containerPort": t.port, "protocol": t.protocol.api_name() }))
        .collect();
    let ips: Vec<Value> = addresses.iter().map(|a| json!({ "ip": a.to_string() })).collect();
    json!({
        "metadata": { "namespace": p.ns, "name": p.name, "labels": l },
        "spec": { "nodeName": node_name, "containers": [{ "name": "serve", "image": "agnhost", "ports": ports }] },
        "status": { "phase": "Running", "podIP": addresses.first().map(ToString::to_string), "podIPs": ips },
    })
}

/// A NetworkPolicy `ns/name` with `spec` as written.
pub fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({ "metadata": { "namespace": ns, "name": name }, "spec": spec })
}

/// x/a: the pod most cases isolate.
pub const XA: Peer = Peer::pod("x", "a");

/// A policy in x selecting x/a with these ingress rules.
pub fn xa_ingress(name: &str, rules: Value) -> Value {
    xa_policy(name, "Ingress", "ingress", rules)
}

/// A policy in x selecting x/a with these egress rules.
pub fn xa_egress(name: &str, rules: Value) -> Value {
    xa_policy(name, "Egress", "egress", rules)
}

fn xa_policy(name: &str, kind: &str, key: &str, rules: Value) -> Value {
    policy("x", name, json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "policyTypes": [kind], key: rules }))
}

/// A peer selecting pods labelled `pod: <name>` in the policy's namespace.
pub fn pod_peer(name: &str) -> Value {
    json!({ "podSelector": { "matchLabels": { "pod": name } } })
}

/// A peer selecting every pod of the namespace labelled `ns: <name>`.
pub fn ns_peer(name: &str) -> Value {
    json!({ "namespaceSelector": { "matchLabels": { "ns": name } } })
}

/// An `ipBlock` peer.
pub fn ip_block(cidr: &str, except: &[String]) -> Value {
    if except.is_empty() {
        json!({ "ipBlock": { "cidr": cidr } })
    } else {
        json!({ "ipBlock": { "cidr": cidr, "except": except } })
    }
}

/// A `ports` entry for `target` by number.
pub fn port(target: Target) -> Value {
    json!({ "protocol": target.protocol.api_name(), "port": target.port })
}

/// A `ports` entry from `target`'s port to `end_port`.
pub fn port_range(target: Target, end_port: u16) -> Value {
    json!({ "protocol": target.protocol.api_name(), "port": target.port, "endPort": end_port })
}
