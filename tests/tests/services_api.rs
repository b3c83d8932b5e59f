//! `ebpf-cni agent` with the node file's `kubeProxyReplacement` against a fake API server that
//! keeps objects (`FakeStore`): the Service model follows the Services and EndpointSlices listed
//! and watched (its debug dump says what the datapath would be told), survives a compaction (410
//! Gone: a new list), and at 10,000 Services × 3 endpoints reaches the sink soon after the first
//! list, each EndpointSlice change after it within milliseconds.
use std::{
    net::SocketAddrV4,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ebpf_cni_tests::{
    FakeStore, Testbed,
    agent::RunningAgent,
    cgroup::TestCgroup,
    fake_store::{NODES, SERVICES, SLICES},
};
use serde_json::{Value, json};

const API: &str = "127.0.0.1:6443";

fn node(name: &str, ip: &str) -> Value {
    json!({ "metadata": { "name": name }, "spec": { "podCIDR": "10.237.1.0/24", "podCIDRs": ["10.237.1.0/24"] },
            "status": { "addresses": [{ "type": "InternalIP", "address": ip }] } })
}

fn service(name: &str, ip: &str, node_port: Option<u16>) -> Value {
    let mut port = json!({ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 });
    let mut spec = json!({ "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"] });
    if let Some(node_port) = node_port {
        port["nodePort"] = json!(node_port);
        spec["type"] = json!("NodePort");
    }
    spec["ports"] = json!([port]);
    json!({ "metadata": { "namespace": "default", "name": name }, "spec": spec })
}

fn slice(name: &str, service: &str, addrs: &[&str]) -> Value {
    let endpoints: Vec<Value> = addrs
        .iter()
        .map(|a| json!({ "addresses": [a], "nodeName": "node-2", "conditions": { "ready": true, "serving": true, "terminating": false } }))
        .collect();
    json!({ "metadata": { "namespace": "default", "name": name, "labels": { "kubernetes.io/service-name": service } },
            "addressType": "IPv4", "endpoints": endpoints, "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }] })
}

/// The node file turning the switch on, as root-owned and 0644 as the agent wants it. The switch
/// is the primary network's; its socket LB attaches to `cgroup` (the test's own), never to the
/// machine's cgroup root.
fn node_file(tb: &Testbed, cgroup: &TestCgroup) -> PathBuf {
    let path = tb.data_dir().with_file_name("node.json");
    let node = json!({ "primaryNetwork": tb.network, "kubeProxyReplacement": true, "cgroupRoot": cgroup.path(),
                       "bpffsRoot": tb.bpffs_root() });
    std::fs::write(&path, node.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn start_agent(tb: &Testbed, cgroup: &TestCgroup, extra: &[&str]) -> RunningAgent {
    let conf = node_file(tb, cgroup);
    let mut args = vec!["--api-server", "http://127.0.0.1:6443", "--node-conf", conf.to_str().unwrap()];
    args.extend_from_slice(extra);
    RunningAgent::start(tb, "node-1", &args).unwrap()
}

/// The dump's frontends as `addr:port/PROTO → [backend addr:port…]`, sorted.
fn frontends(dump: &Path) -> Vec<(String, Vec<String>)> {
    let Ok(text) = std::fs::read_to_string(dump) else { return Vec::new() };
    let dump: Value = serde_json::from_str(&text).unwrap();
    let mut out: Vec<(String, Vec<String>)> = dump["frontends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let fe = &f["frontend"];
            let key = format!("{}:{}/{}", fe["addr"].as_str().unwrap(), fe["port"], fe["protocol"].as_str().unwrap());
            let backends = f["entry"]["backends"].as_array().unwrap();
            (key, backends.iter().map(|b| format!("{}:{}", b["addr"].as_str().unwrap(), b["port"])).collect())
        })
        .collect();
    out.sort();
    out
}

fn wait_for(dump: &Path, want: &[(&str, &[&str])], agent: &RunningAgent) {
    let want: Vec<(String, Vec<String>)> =
        want.iter().map(|(f, b)| (f.to_string(), b.iter().map(ToString::to_string).collect())).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = frontends(dump);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "frontends {now:?}, expected {want:?}; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_model_follows_lists_and_watches() {
    let Some(tb) = Testbed::for_test("the_model_follows_lists_and_watches", "svcapi", "10.237.1.0/24") else {
        return;
    };
    let store = FakeStore::start(&tb.node.name, API.parse::<SocketAddrV4>().unwrap());
    store.put(NODES, [node("node-1", "192.168.1.10")]);
    store.put(SERVICES, [service("web", "10.96.0.1", Some(30080))]);
    let mut headless = service("db", "None", None);
    headless["spec"]["clusterIPs"] = json!(["None"]);
    store.put(SERVICES, [headless]);
    store.put(SLICES, [slice("web-a", "web", &["10.237.2.2", "10.237.2.3"]), slice("db-a", "db", &["10.237.2.9"])]);
    let dump = tb.data_dir().with_file_name("services.json");
    let cgroup = TestCgroup::create(&format!("{}-svcapi", tb.run_id)).unwrap();
    let agent = start_agent(&tb, &cgroup, &["--services-dump", dump.to_str().unwrap()]);
    let both: &[&str] = &["10.237.2.2:8080", "10.237.2.3:8080"];
    wait_for(&dump, &[("10.96.0.1:80/TCP", both), ("192.168.1.10:30080/TCP", both)], &agent);

    // Watch events: an endpoint goes, a Service comes, a bookmark, a Service goes.
    store.put(SLICES, [slice("web-a", "web", &["10.237.2.3"])]);
    let one: &[&str] = &["10.237.2.3:8080"];
    wait_for(&dump, &[("10.96.0.1:80/TCP", one), ("192.168.1.10:30080/TCP", one)], &agent);
    store.put(SERVICES, [service("api", "10.96.0.2", None)]);
    store.put(SLICES, [slice("api-a", "api", &["10.237.2.4"])]);
    store.bookmark(SERVICES);
    let api: &[&str] = &["10.237.2.4:8080"];
    wait_for(&dump, &[("10.96.0.1:80/TCP", one), ("10.96.0.2:80/TCP", api), ("192.168.1.10:30080/TCP", one)], &agent);
    store.delete(SERVICES, "default/web");
    wait_for(&dump, &[("10.96.0.2:80/TCP", api)], &agent);

    // A change, then the history is compacted: the Services' watch was at an older version, so
    // it gets 410 Gone and the agent lists them again.
    let lists_before = store.requests(SERVICES).iter().filter(|(v, _)| v.is_none()).count();
    store.put(SLICES, [slice("api-a", "api", &["10.237.2.5"])]);
    store.compact();
    wait_for(&dump, &[("10.96.0.2:80/TCP", &["10.237.2.5:8080"])], &agent);
    // After the watcher's backoff (under a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.requests(SERVICES).iter().filter(|(v, _)| v.is_none()).count() == lists_before {
        assert!(Instant::now() < deadline, "no new list after 410; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(50));
    }
    // And it watches on from the new list.
    store.put(SERVICES, [service("web", "10.96.0.1", None)]);
    store.put(SLICES, [slice("web-a", "web", &["10.237.2.6"])]);
    wait_for(&dump, &[("10.96.0.1:80/TCP", &["10.237.2.6:8080"]), ("10.96.0.2:80/TCP", &["10.237.2.5:8080"])], &agent);
    let log = agent.log();
    assert!(log.contains("kubeProxyReplacement: serving Services"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// The `sink at N us` stamps of the agent's log, in order.
fn sink_stamps(log: &str) -> Vec<u128> {
    log.lines().filter_map(|l| l.split("(sink at ").nth(1)?.split(' ').next()?.parse().ok()).collect()
}

fn micros(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).unwrap().as_micros()
}

#[test]
fn ten_thousand_services() {
    let Some(tb) = Testbed::for_test("ten_thousand_services", "svcscale", "10.237.1.0/24") else {
        return;
    };
    const SERVICES_COUNT: u32 = 10_000;
    let store = FakeStore::start(&tb.node.name, API.parse::<SocketAddrV4>().unwrap());
    store.put(NODES, [node("node-1", "192.168.1.10")]);
    let ip = |i: u32| std::net::Ipv4Addr::from(0x0a60_0000 + i).to_string();
    let pod = |i: u32, k: u32| std::net::Ipv4Addr::from(0x0ae0_0000 + i * 4 + k).to_string();
    store.put(SERVICES, (0..SERVICES_COUNT).map(|i| service(&format!("s{i}"), &ip(i), None)));
    store.put(
        SLICES,
        (0..SERVICES_COUNT).map(|i| {
            let pods: Vec<String> = (0..3).map(|k| pod(i, k)).collect();
            slice(&format!("s{i}-a"), &format!("s{i}"), &pods.iter().map(String::as_str).collect::<Vec<_>>())
        }),
    );
    let cgroup = TestCgroup::create(&format!("{}-svcapi", tb.run_id)).unwrap();
    let agent = start_agent(&tb, &cgroup, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink_stamps(&agent.log()).is_empty() {
        assert!(Instant::now() < deadline, "no first sync; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(20));
    }
    let log = agent.log();
    assert!(log.contains(&format!("services: first sync, {SERVICES_COUNT} frontends")), "{log}");
    let first_list = [SERVICES, SLICES].iter().flat_map(|p| store.requests(p)).map(|(_, t)| micros(t)).min().unwrap();
    let to_sink = sink_stamps(&log)[0] - first_list;
    println!("10,000 Services x 3 endpoints: first list -> sink in {:.1} ms", to_sink as f64 / 1000.0);

    // One EndpointSlice change at a time: from the store's write to the sink.
    let mut latencies = Vec::new();
    for n in 0..100u32 {
        let i = (n * 97) % SERVICES_COUNT;
        let seen = sink_stamps(&agent.log()).len();
        // Each change is to another Service (97 is prime to 10,000): one endpoint replaced.
        let pods: Vec<String> = (1..4).map(|k| pod(i, k)).collect();
        let at = micros(SystemTime::now());
        store.put(
            SLICES,
            [slice(&format!("s{i}-a"), &format!("s{i}"), &pods.iter().map(String::as_str).collect::<Vec<_>>())],
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let stamp = loop {
            if let Some(stamp) = sink_stamps(&agent.log()).get(seen) {
                break *stamp;
            }
            assert!(Instant::now() < deadline, "change {n} never reached the sink:\n{}", agent.log());
            sleep(Duration::from_millis(1));
        };
        latencies.push(stamp.saturating_sub(at));
    }
    latencies.sort_unstable();
    let (p50, p99) = (latencies[49] as f64 / 1000.0, latencies[98] as f64 / 1000.0);
    println!("EndpointSlice change -> sink at 10,000 Services: p50 {p50:.2} ms, p99 {p99:.2} ms (100 changes)");
    assert!(p99 < 50.0, "p99 {p99} ms");
    // The agent's binary is a debug build here: the bound is the target's, with room for it.
    assert!(to_sink < 10_000_000, "{to_sink} us");
}
