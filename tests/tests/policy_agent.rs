//! `ebpf-cni agent` enforcing NetworkPolicy from a fake API server (`FakeStore`): nothing is
//! isolated before the three first lists, then the policy is in the maps; a pod's label change,
//! and the policy's deletion, reach the datapath within a second; the names file and the
//! metrics say what the agent did.
use std::{
    net::{SocketAddr, SocketAddrV4},
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    thread::sleep,
    time::{Duration, Instant},
};

use aya::maps::{
    Map, MapData,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_cni_tests::{
    Attached, FakeStore, Testbed,
    agent::RunningAgent,
    fake_store::{NAMESPACES, NETWORK_POLICIES, NODES, PODS},
    probe::{self, Servers},
    prometheus,
};
use ebpf_common::{IpKey, PolicyIdentity, identity_prefix_len, names};
use serde_json::{Value, json};

const API: &str = "127.0.0.1:6443";
const METRICS: &str = "127.0.0.1:9464";

fn pod(name: &str, app: &str, at: &Attached) -> Value {
    json!({
        "metadata": {"namespace": "x", "name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c"}], "nodeName": "node-1"},
        "status": {"phase": "Running", "podIP": at.ip.to_string(), "podIPs": [{"ip": at.ip.to_string()}]},
    })
}

fn node_file(tb: &Testbed, extra: Value) -> PathBuf {
    let path = tb.data_dir().with_file_name("node.json");
    let mut node = json!({ "primaryNetwork": tb.network, "bpffsRoot": tb.bpffs_root() });
    node.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    std::fs::write(&path, node.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

/// The identity `POLICY_IDENTITIES` gives the pod's address.
fn identity(tb: &Testbed, pod: &Attached) -> u32 {
    let map = Map::from_map_data(MapData::from_pin(tb.map_pin(names::POLICY_IDENTITIES)).unwrap()).unwrap();
    let trie: LpmTrie<MapData, IpKey, PolicyIdentity> = LpmTrie::try_from(map).unwrap();
    let key = Key::new(identity_prefix_len(32), IpKey::v4(pod.ip.octets()));
    trie.get(&key, 0).map(|i| i.identity).unwrap_or(0)
}

fn reaches(netns: &str, at: SocketAddrV4) -> bool {
    probe::ask_tcp(netns, SocketAddr::from(at)).is_ok()
}

/// Waits until `check` holds; how long it took.
fn within(limit: Duration, what: &str, agent: &RunningAgent, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn the_agent_enforces_policies_from_the_api() {
    let Some(mut tb) = Testbed::for_test("the_agent_enforces_policies_from_the_api", "polag", "10.217.0.0/24") else {
        return;
    };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(b.ip, 8080)).unwrap();
    let to_b = SocketAddrV4::new(b.ip, 8080);

    let store = FakeStore::start(&tb.node.name, API.parse::<SocketAddrV4>().unwrap());
    store.put(
        NODES,
        [json!({"metadata": {"name": "node-1"}, "spec": {"podCIDR": "10.217.0.0/24"},
                             "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}})],
    );
    store.put(NAMESPACES, [json!({"metadata": {"name": "x"}})]);
    store.put(PODS, [pod("a", "client", a), pod("b", "server", b), pod("c", "other", c)]);
    store.put(
        NETWORK_POLICIES,
        [json!({
            "metadata": {"namespace": "x", "name": "server-from-clients"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]},
        })],
    );
    let names = tb.data_dir().with_file_name("policy-names.json");
    let conf = node_file(&tb, json!({}));
    let args = ["--api-server", &format!("http://{API}"), "--node-conf", conf.to_str().unwrap()];
    let more = ["--policy-names", names.to_str().unwrap(), "--metrics-addr", METRICS];
    let agent = RunningAgent::start(&tb, "node-1", &[&args[..], &more[..]].concat()).unwrap();

    let first = within(Duration::from_secs(15), "c → b denied", &agent, || !reaches(&ns[2], to_b));
    println!("first sync enforced {first:?} after the agent started");
    assert!(reaches(&ns[0], to_b), "a is a client");
    let names_file: Value = serde_json::from_str(&std::fs::read_to_string(&names).unwrap()).unwrap();
    assert_eq!(names_file["policies"]["1"], json!("x/server-from-clients"), "{names_file}");
    assert_eq!(names_file["pods"][b.ip.to_string()], json!("x/b"), "{names_file}");

    // c becomes a client: a's identity (timed on the map: a denied probe waits for its timeout).
    let id_a = identity(&tb, a);
    assert_ne!(identity(&tb, c), id_a);
    store.put(PODS, [pod("c", "client", c)]);
    let relabeled = within(Duration::from_secs(1), "c's label change", &agent, || identity(&tb, c) == id_a);
    println!("a label change reached the maps within {relabeled:?}");
    assert!(reaches(&ns[2], to_b), "c → b allowed after its label change");

    // c leaves the clients again, then the policy goes: b is open to everyone.
    store.put(PODS, [pod("c", "other", c)]);
    within(Duration::from_secs(1), "c's label change back", &agent, || identity(&tb, c) != id_a);
    let rules = |tb: &Testbed| tb.map_len("POLICY_RULES").unwrap();
    assert!(!reaches(&ns[2], to_b), "c → b denied again");
    store.delete(NETWORK_POLICIES, "x/server-from-clients");
    let deleted = within(Duration::from_secs(1), "the policy's rules gone", &agent, || rules(&tb) == 0);
    println!("a deletion reached the maps within {deleted:?}");
    assert!(reaches(&ns[2], to_b), "c → b allowed once the policy is gone");

    let (_, _, body) = prometheus::http_get(&tb.node.name, METRICS.parse().unwrap(), "/metrics").unwrap();
    let families = prometheus::parse(&body).unwrap();
    let syncs = prometheus::value(&families, "ebpf_cni_policy_sync_duration_seconds_count", &[]);
    assert!(syncs.is_some_and(|n| n >= 3.0), "{body}");
    assert_eq!(prometheus::value(&families, "ebpf_cni_policy_enforcing", &[]), Some(1.0), "{body}");
    assert!(agent.log().contains("network policy: first sync"), "{}", agent.log());
}

#[test]
fn the_node_file_turns_it_off() {
    let Some(mut tb) = Testbed::for_test("the_node_file_turns_it_off", "polof", "10.218.0.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let store = FakeStore::start(&tb.node.name, API.parse::<SocketAddrV4>().unwrap());
    store.put(NODES, [json!({"metadata": {"name": "node-1"}, "spec": {"podCIDR": "10.218.0.0/24"}})]);
    store.put(NAMESPACES, [json!({"metadata": {"name": "x"}})]);
    store.put(PODS, [pod("a", "client", &pods[0]), pod("b", "server", &pods[1])]);
    store.put(
        NETWORK_POLICIES,
        [json!({"metadata": {"namespace": "x", "name": "deny"},
                                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})],
    );
    let conf = node_file(&tb, json!({"networkPolicy": false}));
    let args = ["--api-server", &format!("http://{API}"), "--node-conf", conf.to_str().unwrap()];
    let agent = RunningAgent::start(&tb, "node-1", &args).unwrap();
    within(Duration::from_secs(5), "the agent's word on it", &agent, || agent.log().contains("networkPolicy is false"));
    sleep(Duration::from_secs(1));
    assert!(store.requests(NETWORK_POLICIES).is_empty(), "no NetworkPolicy was asked for");
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(pods[1].ip, 8080)).unwrap();
    assert!(reaches(&ns[0], SocketAddrV4::new(pods[1].ip, 8080)), "nothing is enforced");
}
