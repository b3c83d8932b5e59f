//! `ebpf-cni policy-set`: NetworkPolicies in the API's JSON, compiled by the agent's compiler
//! and written through its sink into a loaded datapath, then enforced: a pod selected for
//! ingress gets what the rules allow and nothing else; a second run with the policy gone
//! removes its entries and the pod is open again.
use std::net::{SocketAddr, SocketAddrV4};

use ebpf_cni_tests::{
    Attached, Testbed,
    policy_maps::policy_set,
    probe::{self, Servers},
};
use serde_json::{Value, json};

fn pod(name: &str, labels: Value, at: &Attached) -> Value {
    json!({
        "metadata": {"namespace": "x", "name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": at.ip.to_string(), "podIPs": [{"ip": at.ip.to_string()}]},
    })
}

fn reaches(netns: &str, at: SocketAddrV4) -> bool {
    probe::ask_tcp(netns, SocketAddr::from(at)).is_ok()
}

#[test]
fn policy_set_writes_what_the_datapath_enforces() {
    let test = "policy_set_writes_what_the_datapath_enforces";
    let Some(mut tb) = Testbed::for_test(test, "pset", "10.216.0.0/24") else { return };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    for port in [8080, 9090] {
        servers.tcp(&ns[1], SocketAddrV4::new(b.ip, port)).unwrap();
    }
    let at = |port| SocketAddrV4::new(b.ip, port);
    let objects = |policies: Value| {
        json!({
            "namespaces": [{"metadata": {"name": "x", "labels": {"team": "blue"}}}],
            "pods": [pod("a", json!({"app": "client"}), a), pod("b", json!({"app": "server"}), b), pod("c", json!({"app": "other"}), c)],
            "networkPolicies": policies,
        })
    };
    let allow_client = json!([{
        "metadata": {"namespace": "x", "name": "web-from-client"},
        "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": "web"}]}]},
    }]);
    let wrote = policy_set(&tb, &objects(allow_client));
    assert_eq!(wrote["policies"], json!(1), "{wrote}");
    assert_eq!(wrote["endpoints"], json!(3), "{wrote}");
    assert_eq!(wrote["failed"], json!(0), "{wrote}");
    assert!(reaches(&ns[0], at(8080)), "a → b:8080 (the named port) is allowed");
    assert!(!reaches(&ns[0], at(9090)), "a → b:9090: no rule");
    assert!(!reaches(&ns[2], at(8080)), "c → b: not a client");

    // The same input again: nothing to change.
    let again = policy_set(
        &tb,
        &objects(json!([{
            "metadata": {"namespace": "x", "name": "web-from-client"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": "web"}]}]},
        }])),
    );
    assert_eq!(again["changes"], json!(0), "{again}");

    // The policy gone: its rules leave the maps, b is open again.
    let gone = policy_set(&tb, &objects(json!([])));
    assert_eq!(gone["rules"], json!(0), "{gone}");
    assert_eq!(tb.map_len("POLICY_RULES").unwrap_or(0), 0);
    assert!(reaches(&ns[2], at(8080)), "c → b once no policy selects b");
    assert!(reaches(&ns[0], at(9090)));
}
