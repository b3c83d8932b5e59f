//! The cluster of the NetworkPolicy section, in the API's own JSON, one model for both ways it
//! reaches a node: `ebpf-cni policy-set --input FILE` (the steady-state figures) and the fake
//! API server the agent watches (the change → datapath figures).
//!
//! Namespace `bench` holds the measured pair, `client` (app=client, tier=front) and `server`
//! (app=server, tier=back, probe=on, named container ports); ten `other-N` namespaces hold
//! pods of other nodes. The policies, `count` of them (at least 10):
//! - `default-deny`: every pod of `bench` isolated both ways, so that every measured packet is
//!   judged, replies by the flow's cached verdict;
//! - about a quarter select the server and allow the measured flows in from the client, each
//!   a different form of the API (labels, expressions, a namespace AND pod selector, named
//!   ports, `endPort` ranges, an `ipBlock` with `except`);
//! - about a quarter select the client and allow those flows out to the server;
//! - the rest select pods of the other namespaces (labels nobody measured carries), with
//!   ingress and egress rules of every kind.
//!
//! One more policy, `probe`, allows the server's probe port from the client while it is "open";
//! `policy_sync.rs` flips it (and the server's `probe` label) to time a change.
use std::net::Ipv4Addr;

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{Plugin, Testbed};
use serde_json::{Value, json};

use crate::{service_set::CONN_PORT, sockperf};

pub const NAMESPACE: &str = "bench";
/// The port only the `probe` policy allows into the server (while open).
pub const PROBE_PORT: u16 = 5400;
/// A port no policy allows into the server: its connections must fail.
pub const CLOSED_PORT: u16 = 5401;
/// Pods on other nodes (identities of their own; peers of the other policies).
const OTHER_PODS: usize = 1000;
const OTHER_NAMESPACES: usize = 10;
/// The other pods' addresses count up from here (a range no bench namespace uses).
const OTHER_PODS_FROM: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 0);

/// The measured pair's addresses and the cluster's size.
pub struct Cluster {
    pub client: Ipv4Addr,
    pub server: Ipv4Addr,
    pub node: &'static str,
}

impl Cluster {
    pub fn namespaces(&self) -> Vec<Value> {
        let mut all = vec![namespace(NAMESPACE, "bench")];
        all.extend((0..OTHER_NAMESPACES).map(|n| namespace(&format!("other-{n}"), &format!("other-{n}"))));
        all
    }

    /// The measured pair (the server's `probe` label as given), then the other nodes' pods.
    pub fn pods(&self, probe_label: bool) -> Vec<Value> {
        let mut server_labels = json!({ "app": "server", "tier": "back" });
        if probe_label {
            server_labels["probe"] = json!("on");
        }
        let server_ports = json!([
            { "name": "sockperf", "containerPort": sockperf::PORT, "protocol": "TCP" },
            { "name": "sockperf-udp", "containerPort": sockperf::PORT, "protocol": "UDP" },
            { "name": "connect", "containerPort": CONN_PORT, "protocol": "TCP" },
            { "name": "probe", "containerPort": PROBE_PORT, "protocol": "TCP" },
        ]);
        let mut all = vec![
            pod(NAMESPACE, "client", json!({ "app": "client", "tier": "front" }), self.client, self.node, json!([])),
            pod(NAMESPACE, "server", server_labels, self.server, self.node, server_ports),
        ];
        all.extend((0..OTHER_PODS).map(|i| {
            let tier = ["front", "back", "db"][i % 3];
            let labels = json!({ "app": format!("other-{}", i % 100), "tier": tier });
            let ports = json!([{ "name": "http", "containerPort": 8080, "protocol": "TCP" }]);
            let ns = format!("other-{}", i % OTHER_NAMESPACES);
            pod(&ns, &format!("other-{i}"), labels, other_pod_ip(i), "node-2", ports)
        }));
        all
    }

    /// `count` policies (see the module's comment), then `probe` (open or not).
    pub fn policies(&self, count: usize, probe_open: bool) -> Vec<Value> {
        let mut all = vec![default_deny()];
        all.extend((1..count).map(|i| match i % 4 {
            1 => into_server(i, self.client),
            2 => out_of_client(i),
            _ => elsewhere(i),
        }));
        all.push(probe(probe_open));
        all
    }

    /// `policy-set --input`'s file: the whole cluster, the probe open, the server labelled.
    pub fn file(&self, policies: usize) -> Value {
        json!({
            "namespaces": self.namespaces(),
            "pods": self.pods(true),
            "networkPolicies": self.policies(policies, true),
            "nodeAddresses": [],
        })
    }
}

fn other_pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(OTHER_PODS_FROM) + 1 + (i / 250 * 256 + i % 250) as u32)
}

fn namespace(name: &str, team: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": name, "labels": { "kubernetes.io/metadata.name": name, "team": team } } })
}

fn pod(ns: &str, name: &str, labels: Value, ip: Ipv4Addr, node: &str, ports: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "namespace": ns, "name": name, "labels": labels, "uid": format!("uid-{ns}-{name}") },
        "spec": { "nodeName": node, "containers": [{ "name": "main", "image": "bench", "ports": ports }] },
        "status": { "phase": "Running", "podIP": ip.to_string(), "podIPs": [{ "ip": ip.to_string() }] },
    })
}

fn policy(ns: &str, name: &str, selector: Value, types: &[&str], ingress: Value, egress: Value) -> Value {
    let mut spec = json!({ "podSelector": selector, "policyTypes": types });
    if !ingress.is_null() {
        spec["ingress"] = ingress;
    }
    if !egress.is_null() {
        spec["egress"] = egress;
    }
    json!({ "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": { "namespace": ns, "name": name }, "spec": spec })
}

fn default_deny() -> Value {
    policy(NAMESPACE, "default-deny", json!({}), &["Ingress", "Egress"], Value::Null, Value::Null)
}

/// The measured flows' ports as a policy lists them: sockperf over TCP and UDP, the
/// connection rate's.
fn measured_ports() -> Value {
    json!([
        { "protocol": "TCP", "port": sockperf::PORT },
        { "protocol": "UDP", "port": sockperf::PORT },
        { "protocol": "TCP", "port": CONN_PORT },
    ])
}

/// Policy `i`: into the server from the client, in one of four forms.
fn into_server(i: usize, client: Ipv4Addr) -> Value {
    let name = format!("server-in-{i}");
    let client_pods = json!({ "matchLabels": { "app": "client" } });
    let (selector, from, ports) = match i / 4 % 4 {
        0 => (json!({ "matchLabels": { "app": "server" } }), json!([{ "podSelector": client_pods }]), measured_ports()),
        1 => (
            json!({ "matchExpressions": [{ "key": "app", "operator": "In", "values": ["server", format!("other-{}", i % 100)] }] }),
            json!([{ "namespaceSelector": { "matchLabels": { "team": "bench" } }, "podSelector": client_pods }]),
            json!([
                { "protocol": "TCP", "port": "sockperf" },
                { "protocol": "UDP", "port": "sockperf-udp" },
                { "protocol": "TCP", "port": "connect" },
            ]),
        ),
        2 => (
            json!({ "matchLabels": { "tier": "back" } }),
            json!([{ "podSelector": { "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["front"] }] } }]),
            json!([
                { "protocol": "TCP", "port": 11000 + i % 100, "endPort": 11999 },
                { "protocol": "UDP", "port": sockperf::PORT },
                { "protocol": "TCP", "port": 5300, "endPort": 5310 },
            ]),
        ),
        _ => {
            // The client's own /32 is not excepted: the block holds it.
            let cidr = format!("{}/24", Ipv4Addr::from(u32::from(client) & 0xffff_ff00));
            let except = format!("{}/32", Ipv4Addr::from((u32::from(client) & 0xffff_ff00) | 0xfe));
            (
                json!({ "matchLabels": { "app": "server" } }),
                json!([{ "ipBlock": { "cidr": cidr, "except": [except] } }, { "podSelector": { "matchLabels": { "app": format!("other-{}", i % 100) } } }]),
                measured_ports(),
            )
        }
    };
    policy(NAMESPACE, &name, selector, &["Ingress"], json!([{ "from": from, "ports": ports }]), Value::Null)
}

/// Policy `i`: out of the client to the server, in one of four forms; the last allows every
/// port (the probe's way out).
fn out_of_client(i: usize) -> Value {
    let name = format!("client-out-{i}");
    let server_pods = json!({ "matchLabels": { "app": "server" } });
    let (selector, to, ports) = match i / 4 % 4 {
        0 => (json!({ "matchLabels": { "app": "client" } }), json!([{ "podSelector": server_pods }]), measured_ports()),
        1 => (
            json!({ "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["front", "edge"] }] }),
            json!([{ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": NAMESPACE } }, "podSelector": server_pods }]),
            json!([
                { "protocol": "TCP", "port": "sockperf" },
                { "protocol": "UDP", "port": "sockperf-udp" },
                { "protocol": "TCP", "port": "connect" },
            ]),
        ),
        2 => (
            json!({ "matchLabels": { "app": "client" } }),
            json!([{ "podSelector": { "matchLabels": { "tier": "back" } } }]),
            json!([{ "protocol": "TCP", "port": 5000, "endPort": 12000 }, { "protocol": "UDP", "port": sockperf::PORT }]),
        ),
        _ => (json!({ "matchLabels": { "app": "client" } }), json!([{ "podSelector": server_pods }]), Value::Null),
    };
    let mut rule = json!({ "to": to });
    if !ports.is_null() {
        rule["ports"] = ports;
    }
    policy(NAMESPACE, &name, selector, &["Egress"], Value::Null, json!([rule]))
}

/// Policy `i`: pods of the other namespaces, nothing the measured pair matches.
fn elsewhere(i: usize) -> Value {
    let ns = format!("other-{}", i % OTHER_NAMESPACES);
    let name = format!("other-{i}");
    let selector = json!({ "matchLabels": { "app": format!("other-{}", i % 100) } });
    let peer_app = json!({ "matchLabels": { "app": format!("other-{}", (i + 7) % 100) } });
    let port = json!([{ "protocol": "TCP", "port": 80 + (i % 50) }]);
    match i % 3 {
        0 => {
            let from = json!([{ "namespaceSelector": { "matchLabels": { "team": format!("other-{}", (i + 1) % OTHER_NAMESPACES) } }, "podSelector": peer_app }]);
            policy(&ns, &name, selector, &["Ingress"], json!([{ "from": from, "ports": port }]), Value::Null)
        }
        1 => {
            let to = json!([{ "ipBlock": { "cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", format!("192.168.{}.0/24", i % 256)] } }]);
            policy(&ns, &name, selector, &["Egress"], Value::Null, json!([{ "to": to, "ports": port }]))
        }
        _ => {
            let cidr = format!("10.244.{}.0/24", i % 4);
            let from = json!([{ "ipBlock": { "cidr": cidr, "except": [format!("10.244.{}.{}/32", i % 4, 1 + i % 200)] } }, { "podSelector": peer_app }]);
            let to = json!([{ "podSelector": {} }]);
            let named = json!([{ "protocol": "TCP", "port": "http" }]);
            policy(
                &ns,
                &name,
                selector,
                &["Ingress", "Egress"],
                json!([{ "from": from, "ports": named }]),
                json!([{ "to": to, "ports": [{ "protocol": "UDP", "port": 53 }] }]),
            )
        }
    }
}

/// Into the server's probe port from the client: `open` allows the probe port, else only the
/// port beside it (the policy still selects the server, its rule no longer matches the probe).
pub fn probe(open: bool) -> Value {
    let port = if open { PROBE_PORT } else { PROBE_PORT + 2 };
    let from = json!([{ "podSelector": { "matchLabels": { "app": "client" } } }]);
    policy(
        NAMESPACE,
        "probe",
        json!({ "matchLabels": { "app": "server", "probe": "on" } }),
        &["Ingress"],
        json!([{ "from": from, "ports": [{ "protocol": "TCP", "port": port }] }]),
        Value::Null,
    )
}

/// Whether `plugin` has the `policy-set` command (a release before NetworkPolicy has not).
pub fn supported(plugin: &Plugin) -> bool {
    std::process::Command::new(&plugin.binary)
        .args(["policy-set", "--help"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Writes `cluster`'s `policies` into the policy maps of `tb`'s network (its datapath loaded).
pub fn write_to_maps(tb: &Testbed, cluster: &Cluster, policies: usize) -> Result<()> {
    write_file(tb, &cluster.file(policies))
}

/// The same cluster without a NetworkPolicy: no pod isolated, every check a miss in
/// `POLICY_ENDPOINTS` again (what a node without policy runs).
pub fn clear_maps(tb: &Testbed, cluster: &Cluster) -> Result<()> {
    let mut file = cluster.file(0);
    file["networkPolicies"] = json!([]);
    write_file(tb, &file)
}

fn write_file(tb: &Testbed, file: &Value) -> Result<()> {
    let path = tb.data_dir().with_file_name("policies.json");
    std::fs::write(&path, file.to_string())?;
    let out = std::process::Command::new(&tb.plugin.binary)
        .args(["policy-set", "--network", &tb.network, "--bpffs-root"])
        .arg(tb.bpffs_root())
        .arg("--input")
        .arg(&path)
        .output()
        .context("running ebpf-cni policy-set")?;
    ensure!(out.status.success(), "policy-set: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        Cluster { client: Ipv4Addr::new(10, 242, 0, 2), server: Ipv4Addr::new(10, 242, 0, 3), node: "node-1" }
    }

    #[test]
    fn a_thousand_policies_each_named_once_and_a_quarter_each_way_for_the_pair() {
        let all = cluster().policies(1000, true);
        assert_eq!(all.len(), 1001);
        let mut names: Vec<String> =
            all.iter().map(|p| format!("{}/{}", p["metadata"]["namespace"], p["metadata"]["name"])).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        let named =
            |prefix: &str| all.iter().filter(|p| p["metadata"]["name"].as_str().unwrap().starts_with(prefix)).count();
        assert_eq!(named("server-in-"), 250);
        assert_eq!(named("client-out-"), 250);
    }

    #[test]
    fn other_pods_have_distinct_addresses_outside_the_bench_nodes() {
        let ips: std::collections::BTreeSet<Ipv4Addr> = (0..OTHER_PODS).map(other_pod_ip).collect();
        assert_eq!(ips.len(), OTHER_PODS);
        assert!(ips.iter().all(|ip| ip.octets()[0..2] == [10, 244] && ip.octets()[3] != 0));
    }

    #[test]
    fn the_ip_block_holds_the_client_and_excepts_another_address() {
        let p = into_server(12, Ipv4Addr::new(10, 242, 0, 2));
        let block = &p["spec"]["ingress"][0]["from"][0]["ipBlock"];
        assert_eq!(block["cidr"], "10.242.0.0/24");
        assert_eq!(block["except"][0], "10.242.0.254/32");
    }
}
