//! The compiler's semantics, checked the way Kubernetes' own network-policy e2e tests check a
//! cluster: namespaces x, y, z with pods a, b, c, every pair probed against an emulation of the
//! datapath's lookups (`World::allows`), the whole matrix compared with the expected one.
mod bad_input;
mod ip_blocks;
mod ports;
mod scale;
mod selectors;
mod stability;

use std::net::IpAddr;

use ebpf_common::{
    IDENTITY_ANY, IDENTITY_HOST, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED,
    POLICY_INGRESS_ISOLATED, POLICY_RULE_ANY_PORT_BITS, POLICY_RULE_ANY_PROTOCOL_BITS, host_veth_slot,
};
use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::NetworkPolicy,
};
use serde_json::{Value, json};

use super::{Compiled, Compiler, Input, Local, Prefix};

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const SCTP: u8 = 132;
pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];

pub struct World {
    pub input: Input,
    pub compiler: Compiler,
    pub out: Compiled,
}

pub fn namespace(name: &str, labels: Value) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

/// A pod serving TCP, UDP and SCTP on 80 and 81 under upstream's port names (`serve-80-tcp`).
pub fn pod(ns: &str, name: &str, labels: Value, ips: &[&str]) -> Pod {
    let mut ports = Vec::new();
    for port in [80, 81] {
        for proto in ["TCP", "UDP", "SCTP"] {
            let name = format!("serve-{port}-{}", proto.to_lowercase());
            ports.push(json!({"name": name, "containerPort": port, "protocol": proto}));
        }
    }
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ips.first(), "podIPs": pod_ips},
    }))
    .unwrap()
}

pub fn policy(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
}

/// `x/a` → 10.0.1.1 and fd00::1:1.
pub fn v4(pod: &str) -> IpAddr {
    let (n, p) = indexes(pod);
    format!("10.0.{n}.{p}").parse().unwrap()
}

pub fn v6(pod: &str) -> IpAddr {
    let (n, p) = indexes(pod);
    format!("fd00::{n}:{p}").parse().unwrap()
}

fn indexes(pod: &str) -> (usize, usize) {
    let (ns, name) = pod.split_once('/').unwrap();
    let n = NAMESPACES.iter().position(|x| *x == ns).unwrap() + 1;
    let p = PODS.iter().position(|x| *x == name).unwrap() + 1;
    (n, p)
}

pub fn all_pods() -> Vec<String> {
    NAMESPACES.iter().flat_map(|ns| PODS.iter().map(move |p| format!("{ns}/{p}"))).collect()
}

pub const NODE: &str = "192.168.0.10";

impl World {
    /// x, y, z with a, b, c each (labels `pod: <name>`, namespaces `ns: <name>`), dual-stack,
    /// all on this node.
    pub fn xyz() -> Self {
        let mut input = Input::default();
        for (i, name) in all_pods().iter().enumerate() {
            let (ns, p) = name.split_once('/').unwrap();
            let (a, b) = (v4(name).to_string(), v6(name).to_string());
            input.apply_pod(&pod(ns, p, json!({"pod": p}), &[&a, &b]));
            let local = Local { ifindex: 100 + i as u32, owner: 1000 + i as u64 };
            input.locals.insert(v4(name), local);
            input.locals.insert(v6(name), local);
        }
        for ns in NAMESPACES {
            input.apply_namespace(&namespace(ns, json!({"ns": ns})));
        }
        input.node_addrs.insert(NODE.parse().unwrap());
        let mut world = Self { input, compiler: Compiler::default(), out: Compiled::default() };
        world.compile();
        world
    }

    pub fn add(&mut self, ns: &str, name: &str, spec: Value) -> &mut Self {
        self.input.apply_policy(&policy(ns, name, spec));
        self.compile();
        self
    }

    pub fn compile(&mut self) {
        self.out = self.compiler.compile(&self.input);
    }

    pub fn identity(&self, addr: IpAddr) -> u32 {
        let found = self.out.identities.iter().filter(|(p, _)| p.contains_addr(addr)).max_by_key(|(p, _)| p.bits);
        *found.expect("the /0 entries catch every address").1
    }

    fn endpoint(&self, addr: IpAddr) -> Option<ebpf_common::PolicyEndpoint> {
        let local = self.input.locals.get(&addr)?;
        // As the datapath finds it: its slot, or by ifindex when the slot holds another veth.
        let slot = self.out.endpoints.get(&host_veth_slot(local.ifindex));
        let entry = match slot {
            Some(held) if held.ifindex != local.ifindex => self.out.endpoints_by_ifindex.get(&local.ifindex)?,
            held => held?,
        };
        (entry.ifindex == local.ifindex && entry.owner == local.owner).then_some(*entry)
    }

    /// The two lookups the datapath makes for an isolated subject: the peer, then ANY.
    fn hit(&self, subject: u32, peer: u32, direction: u8, protocol: u8, port: u16) -> bool {
        [peer, IDENTITY_ANY].iter().any(|&peer| {
            self.out.rules.keys().any(|k| {
                if (k.subject, k.peer, k.direction) != (subject, peer, direction) {
                    return false;
                }
                if k.prefix_len == POLICY_RULE_ANY_PROTOCOL_BITS {
                    return true;
                }
                let bits = k.prefix_len - POLICY_RULE_ANY_PORT_BITS;
                let mask = if bits == 0 { 0 } else { u16::MAX << (16 - bits) };
                k.protocol == protocol && port & mask == u16::from_be_bytes(k.port_be)
            })
        })
    }

    /// Whether a new flow `from` → `to` is allowed, as the datapath would judge it.
    pub fn allows_addr(&self, from: IpAddr, to: IpAddr, protocol: u8, port: u16) -> bool {
        let (src, dst) = (self.identity(from), self.identity(to));
        let egress = self.endpoint(from).filter(|e| e.flags & POLICY_EGRESS_ISOLATED != 0);
        if egress.is_some_and(|ep| !self.hit(ep.identity, dst, POLICY_DIRECTION_EGRESS, protocol, port)) {
            return false;
        }
        // The node is always let in (kubelet's probes).
        let ingress = self.endpoint(to).filter(|e| e.flags & POLICY_INGRESS_ISOLATED != 0 && src != IDENTITY_HOST);
        ingress.is_none_or(|ep| self.hit(ep.identity, src, POLICY_DIRECTION_INGRESS, protocol, port))
    }

    pub fn allows(&self, from: &str, to: &str, protocol: u8, port: u16) -> bool {
        self.allows_addr(v4(from), v4(to), protocol, port)
    }

    /// Compares every pair (IPv4, and IPv6 unless `v4_only`) with `expected`; lists the wrong.
    pub fn check(&self, protocol: u8, port: u16, expected: impl Fn(&str, &str) -> bool) {
        self.check_families(protocol, port, true, &expected);
    }

    pub fn check_families(&self, protocol: u8, port: u16, v6_too: bool, expected: &impl Fn(&str, &str) -> bool) {
        let mut wrong = Vec::new();
        for from in all_pods() {
            for to in all_pods() {
                let want = expected(&from, &to);
                if self.allows(&from, &to, protocol, port) != want {
                    wrong.push(format!("{from} → {to} v4 (want {})", if want { "allowed" } else { "denied" }));
                }
                if v6_too && self.allows_addr(v6(&from), v6(&to), protocol, port) != want {
                    wrong.push(format!("{from} → {to} v6 (want {})", if want { "allowed" } else { "denied" }));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "proto {protocol} port {port}: {} wrong:\n{}\nproblems: {:?}",
            wrong.len(),
            wrong.join("\n"),
            self.out.problems
        );
    }
}

pub fn prefix(text: &str) -> Prefix {
    Prefix::parse(text).unwrap()
}

#[test]
fn no_policy_allows_everything() {
    let w = World::xyz();
    w.check(TCP, 80, |_, _| true);
    assert!(w.out.rules.is_empty());
    assert!(w.out.endpoints.values().all(|e| e.flags == 0), "every local pod written, none isolated");
    assert_eq!(w.out.endpoints.len(), 9);
}

#[test]
fn deny_all_ingress_in_one_namespace() {
    let mut w = World::xyz();
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    w.check(TCP, 80, |_, to| !to.starts_with("x/"));
    // `ingress: []` and no policyTypes mean the same.
    let mut w = World::xyz();
    w.add("x", "deny", json!({"podSelector": {}, "ingress": []}));
    w.check(UDP, 81, |_, to| !to.starts_with("x/"));
}

#[test]
fn the_node_is_always_allowed_in() {
    let mut w = World::xyz();
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    assert!(w.allows_addr(NODE.parse().unwrap(), v4("x/a"), TCP, 80));
    assert_eq!(w.identity(NODE.parse().unwrap()), IDENTITY_HOST);
}

#[test]
fn allow_all_ingress_forms() {
    for spec in [
        json!({"podSelector": {}, "ingress": [{}]}),
        json!({"podSelector": {}, "ingress": [{"from": []}]}),
        json!({"podSelector": {}, "ingress": [{"from": [], "ports": []}]}),
    ] {
        let mut w = World::xyz();
        w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
        w.add("x", "allow", spec.clone());
        w.check(TCP, 80, |_, _| true);
        w.check(SCTP, 81, |_, _| true);
    }
}

#[test]
fn deny_all_egress_and_default_policy_types() {
    let mut w = World::xyz();
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    w.check(TCP, 80, |from, _| !from.starts_with("x/"));
    // Egress rules without policyTypes: Ingress (no rule: deny) and Egress both.
    let mut w = World::xyz();
    w.add("x", "e", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"podSelector": {}}]}]}));
    w.check(TCP, 80, |from, to| {
        let ingress = to != "x/a";
        let egress = from != "x/a" || to.starts_with("x/");
        ingress && egress
    });
    // policyTypes [Egress] only: ingress stays open even with ingress rules given.
    let mut w = World::xyz();
    let spec = json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]});
    w.add("x", "e", spec);
    w.check(TCP, 80, |from, to| !from.starts_with("x/") || to.starts_with("y/"));
}

#[test]
fn several_policies_on_one_pod_are_a_union() {
    let mut w = World::xyz();
    let from = |pod: &str| json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": pod}}}]}]});
    w.add("x", "from-b", from("b"));
    w.add("x", "from-c", from("c"));
    w.check(TCP, 80, |from, to| to != "x/a" || from == "x/b" || from == "x/c");
    // The denied flows count on the first policy by name; each rule on the policy that allows it.
    let ep = w.endpoint(v4("x/a")).unwrap();
    assert_eq!(ep.ingress_slot, w.compiler.slot("x", "from-b"));
    assert_eq!(ep.egress_slot, 0);
}

#[test]
fn pods_of_other_nodes_are_peers_not_subjects() {
    let mut w = World::xyz();
    w.input.locals.retain(|ip, _| *ip != v4("x/a") && *ip != v6("x/a"));
    w.add("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
    // x/a lives elsewhere: this node judges nothing into or out of it (its own node does).
    w.check(TCP, 80, |from, to| (!from.starts_with("x/") || from == "x/a") && (!to.starts_with("x/") || to == "x/a"));
    assert_eq!(w.out.endpoints.len(), 8);
}
