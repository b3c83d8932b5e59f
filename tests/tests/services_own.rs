//! Issue 25's "Service suite again with the switch on": the Services `services.rs` gives
//! kube-proxy (a local, a remote and an outside endpoint, a pod's own Service, kube-dns with two
//! endpoints, NodePorts), served by ebpf-cni's own Service LB on both nodes of a dual-stack LAN:
//! `kubeProxyReplacement` in each node file, each node's agent fed by a fake API server in its
//! node namespace, no kube-proxy, and not one iptables or nft rule on either node. Clients run as
//! python3 processes in the node's cgroup (one per node, each node's programs attached there:
//! a cgroup's programs see every socket of its processes whatever their namespace, so the nodes
//! cannot share one, nor could this test process join one). Checks: ClusterIP over TCP,
//! connected and unconnected UDP, IPv4 and IPv6, the application seeing the ClusterIP and the
//! server the source the path decides; NodePorts from the LAN and from pods, hairpin, refusals
//! at once without endpoint; endpoint churn under traffic; an agent restart under traffic;
//! nothing left after the DELs. Everything is run and the failures listed at the end.
use std::{
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    thread::sleep,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    FakeStore,
    agent::RunningAgent,
    cgroup::TestCgroup,
    fake_store::{NODES, SERVICES, SLICES},
    lan::{Ipv6Plan, LAN_HOST, LAN_HOST_V6, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan, LanPod},
    probe::{self, Servers},
    run, run_in,
    service_probe::{Client, Tagged},
    traffic::in_netns,
};
use serde_json::{Value, json};

const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;
/// The host's "API server", behind the `kubernetes` Service.
const HOST_API_PORT: u16 = 6443;
/// The churn Service's ports, where tagged servers say which backend answered.
const CHURN_TCP: u16 = 8090;
const CHURN_UDP: u16 = 5390;
const CLUSTER_CIDR: &str = "10.234.0.0/16";
const SUBNETS: [&str; 2] = ["10.234.1.0/24", "10.234.2.0/24"];
const PLAN: Ipv6Plan =
    Ipv6Plan { cluster_cidr: "fd00:10:234::/56", subnets: ["fd00:10:234:1::/64", "fd00:10:234:2::/64"] };
/// Frontends each node must hold: see `services`.
const FRONTENDS: usize = 31;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address")
}

fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// A Service of `ports` (name, port, protocol, targetPort, nodePort) on `ips` (one a family).
fn service(key: &str, ips: &[&str], ports: &[(&str, u16, &str, u16, Option<u16>)]) -> Value {
    let (namespace, name) = key.split_once('/').unwrap();
    let families: Vec<&str> = ips.iter().map(|i| if i.contains(':') { "IPv6" } else { "IPv4" }).collect();
    let node_ports = ports.iter().any(|p| p.4.is_some());
    let policy = if ips.len() == 2 { "RequireDualStack" } else { "SingleStack" };
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, port, protocol, target, node_port)| {
            let mut p = json!({ "name": n, "port": port, "protocol": protocol, "targetPort": target });
            if let Some(np) = node_port {
                p["nodePort"] = json!(np);
            }
            p
        })
        .collect();
    json!({ "metadata": { "namespace": namespace, "name": name },
            "spec": { "type": if node_ports { "NodePort" } else { "ClusterIP" }, "clusterIP": ips[0],
                      "clusterIPs": ips, "ipFamilies": families, "ipFamilyPolicy": policy,
                      "ports": ports } })
}

/// The EndpointSlice `<service>-v4` or `-v6` of `endpoints` (address, node) and `ports`.
fn slice(key: &str, v6: bool, endpoints: &[(IpAddr, &str)], ports: &[(&str, u16, &str)]) -> Value {
    let (namespace, name) = key.split_once('/').unwrap();
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(a, node)| {
            json!({ "addresses": [a.to_string()], "nodeName": node,
                                 "conditions": { "ready": true, "serving": true, "terminating": false } })
        })
        .collect();
    let ports: Vec<Value> =
        ports.iter().map(|(n, p, proto)| json!({ "name": n, "port": p, "protocol": proto })).collect();
    json!({ "metadata": { "namespace": namespace, "name": format!("{name}-{}", if v6 { "v6" } else { "v4" }),
                          "labels": { "kubernetes.io/service-name": name } },
            "addressType": if v6 { "IPv6" } else { "IPv4" }, "endpoints": endpoints, "ports": ports })
}

const WEB: [(&str, u16, &str); 2] = [("http", TCP_PORT, "TCP"), ("dns", UDP_PORT, "UDP")];
const CHURN: [(&str, u16, &str); 2] = [("http", CHURN_TCP, "TCP"), ("dns", CHURN_UDP, "UDP")];

fn web(key: &str, ips: &[&str], node_port: Option<u16>) -> Value {
    service(key, ips, &[("http", 80, "TCP", TCP_PORT, node_port), ("dns", 53, "UDP", UDP_PORT, None)])
}

/// Both families' slices of a Service whose endpoints are `pods` (with their node's name).
fn pod_slices(key: &str, pods: &[(&LanPod, &str)], ports: &[(&str, u16, &str)]) -> [Value; 2] {
    let v4: Vec<(IpAddr, &str)> = pods.iter().map(|(p, n)| (p.ip.into(), *n)).collect();
    let v6: Vec<(IpAddr, &str)> = pods.iter().map(|(p, n)| (p.ip6.unwrap().into(), *n)).collect();
    [slice(key, false, &v4, ports), slice(key, true, &v6, ports)]
}

struct Pods {
    /// Node 1: the client (also its own Service's endpoint) and a server; node 2: a server.
    a: LanPod,
    b: LanPod,
    c: LanPod,
}

/// What kube-proxy got in `services.rs`, dual-stack, plus `empty` (no endpoint) and `churn`.
/// Frontends a node: local, remote, self and empty × (2 ClusterIP ports + 1 NodePort) × 2
/// families = 24, kubernetes 2 ports × 2 families, kube-dns 1, churn 2 (IPv4 only): 31.
fn services(stores: &[FakeStore], p: &Pods) {
    let (n1, n2) = ("node-1", "node-2");
    let put = |path: &str, objects: &[Value]| {
        for s in stores {
            s.put(path, objects.to_vec());
        }
    };
    let nodes: Vec<Value> = (0..2)
        .map(|i| {
            json!({ "metadata": { "name": format!("node-{}", i + 1) }, "spec": { "podCIDR": SUBNETS[i],
                        "podCIDRs": [SUBNETS[i], PLAN.subnets[i]] },
                    "status": { "addresses": [{ "type": "InternalIP", "address": LAN_NODE_IPS[i] },
                                              { "type": "InternalIP", "address": LAN_NODE_IPV6S[i] }] } })
        })
        .collect();
    put(NODES, &nodes);
    let outside = [("https", 443, "TCP", HOST_API_PORT, None), ("dns", 53, "UDP", UDP_PORT, None)];
    put(
        SERVICES,
        &[
            web("default/local", &["10.96.1.1", "fd00:10:96::101"], Some(30080)),
            web("default/remote", &["10.96.2.1", "fd00:10:96::201"], Some(30081)),
            web("default/self", &["10.96.3.1", "fd00:10:96::301"], Some(30082)),
            web("default/empty", &["10.96.4.1", "fd00:10:96::401"], Some(30083)),
            // Like the `kubernetes` Service: its endpoint is a machine outside the cluster.
            service("default/kubernetes", &["10.96.0.1", "fd00:10:96::1"], &outside),
            service("kube-system/kube-dns", &["10.96.0.10"], &[("dns", 53, "UDP", UDP_PORT, None)]),
            service(
                "default/churn",
                &["10.96.5.1"],
                &[("http", 80, "TCP", CHURN_TCP, None), ("dns", 53, "UDP", CHURN_UDP, None)],
            ),
        ],
    );
    let host = [(ip(LAN_HOST), ""), (ip(LAN_HOST_V6), "")];
    let host_ports = [("https", HOST_API_PORT, "TCP"), ("dns", UDP_PORT, "UDP")];
    let mut slices = Vec::new();
    slices.extend(pod_slices("default/local", &[(&p.b, n1)], &WEB));
    slices.extend(pod_slices("default/remote", &[(&p.c, n2)], &WEB));
    slices.extend(pod_slices("default/self", &[(&p.a, n1)], &WEB));
    slices.push(slice("default/kubernetes", false, &host[..1], &host_ports));
    slices.push(slice("default/kubernetes", true, &host[1..], &host_ports));
    slices.push(pod_slices("kube-system/kube-dns", &[(&p.b, n1), (&p.c, n2)], &WEB[1..])[0].clone());
    slices.push(pod_slices("default/churn", &[(&p.b, n1)], &CHURN)[0].clone());
    put(SLICES, &slices);
}

fn start_agent(lan: &Lan, i: usize, node_file: &Path) -> RunningAgent {
    let args = ["--api-server", "http://127.0.0.1:6443", "--node-conf", node_file.to_str().unwrap(), "--interval", "1"];
    RunningAgent::start(&lan.nodes[i], &format!("node-{}", i + 1), &args).unwrap()
}

/// What a flow's server must have seen as the source (`None`: any, the path decides nothing).
type Saw = Option<IpAddr>;

/// Checks a client's line: answered by `to` itself (the application sees the frontend) with
/// the source `saw`.
fn answered(line: &Value, to: SocketAddr, saw: Saw) -> anyhow::Result<()> {
    let from = line.get("peer").or(line.get("source")).and_then(Value::as_str);
    anyhow::ensure!(from == Some(to.to_string().as_str()), "{line}");
    let seen: SocketAddr = line["reply"].as_str().unwrap_or_default().parse()?;
    match saw {
        Some(expected) if seen.ip() != expected => anyhow::bail!("the server saw {seen}, not {expected}"),
        _ => Ok(()),
    }
}

/// A TCP connect from `netns` (outside any cgroup: the LAN) refused: its errno, how long.
fn refused_from_outside(netns: &str, to: SocketAddr) -> anyhow::Result<()> {
    let (errno, took) = in_netns(netns, move || {
        let started = Instant::now();
        let outcome = TcpStream::connect_timeout(&to, Duration::from_secs(2));
        Ok((outcome.err().and_then(|e| e.raw_os_error()), started.elapsed()))
    })?;
    anyhow::ensure!(errno == Some(libc::ECONNREFUSED), "errno {errno:?} after {took:?}");
    anyhow::ensure!(took < Duration::from_millis(100), "refused, but after {took:?}");
    Ok(())
}

/// A client in a cgroup refused at once.
fn refused(line: &Value) -> anyhow::Result<()> {
    anyhow::ensure!(line["error"] == json!(libc::ECONNREFUSED), "{line}");
    anyhow::ensure!(line["ms"].as_f64().unwrap_or(1e9) < 100.0, "not at once: {line}");
    Ok(())
}

/// CLOCK_MONOTONIC, python's `time.monotonic()`: the loop client's timestamps.
fn monotonic() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The loop client's lines up to `until` (monotonic seconds).
fn lines_until(client: &Client, until: f64) -> Vec<Value> {
    let mut lines = Vec::new();
    loop {
        let line = client.next(Duration::from_secs(3));
        let t = line["t"].as_f64().unwrap_or(f64::MAX);
        lines.push(line);
        if t >= until {
            return lines;
        }
    }
}

/// Failures among a loop client's `lines`: a request failing after its retry, or, from `after`
/// on, one answered by a backend not in `allowed`.
fn loop_failures(lines: &[Value], after: f64, allowed: &[&str], what: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for line in lines {
        let t = line["t"].as_f64().unwrap_or(0.0);
        if line.get("error").is_some() {
            failures.push(format!("{what}: a request failed twice: {line}"));
        } else if t >= after && !allowed.contains(&line["reply"].as_str().unwrap_or("")) {
            failures.push(format!("{what}: {:.0} ms after the change, answered by {line}", (t - after) * 1000.0));
        }
    }
    failures
}

fn retries(lines: &[Value]) -> u64 {
    lines.iter().filter_map(|l| l["retries"].as_u64()).sum()
}

#[test]
fn the_service_suite_with_our_own_service_lb() {
    let test = "the_service_suite_with_our_own_service_lb";
    let Some(mut lan) = Lan::for_test_dual_stack(test, "own", CLUSTER_CIDR, SUBNETS, PLAN) else {
        return;
    };
    let started = Instant::now();
    let run_id = lan.nodes[0].run_id.clone();
    let cgroups = [1, 2].map(|i| TestCgroup::create(&format!("{run_id}-own{i}")).unwrap());
    let cluster = format!("{CLUSTER_CIDR},{}", PLAN.cluster_cidr);
    let files = [0, 1].map(|i| lan.use_kube_proxy_replacement(i, &cgroups[i], &cluster, Some(PLAN.subnets[i])));
    let pods = Pods { a: lan.add_pod(0).unwrap(), b: lan.add_pod(0).unwrap(), c: lan.add_pod(1).unwrap() };
    let (a, b, c) = (&pods.a, &pods.b, &pods.c);
    let mut servers = Servers::default();
    for pod in [a, b, c] {
        for ip in [IpAddr::V4(pod.ip), IpAddr::V6(pod.ip6.unwrap())] {
            servers.tcp(&pod.netns, at(ip, TCP_PORT)).unwrap();
            servers.udp(&pod.netns, at(ip, UDP_PORT)).unwrap();
        }
    }
    let host = lan.host.name.clone();
    servers.tcp(&host, at(ip(LAN_HOST), HOST_API_PORT)).unwrap();
    servers.udp(&host, at(ip(LAN_HOST), UDP_PORT)).unwrap();
    servers.tcp(&host, at(ip(LAN_HOST_V6), HOST_API_PORT)).unwrap();
    servers.udp(&host, at(ip(LAN_HOST_V6), UDP_PORT)).unwrap();
    let tagged =
        [Tagged::on_ports(&b.netns, "L", CHURN_TCP, CHURN_UDP), Tagged::on_ports(&c.netns, "R", CHURN_TCP, CHURN_UDP)];

    let stores = [0, 1].map(|i| FakeStore::start(&lan.nodes[i].node.name, "127.0.0.1:6443".parse().unwrap()));
    services(&stores, &pods);
    let mut agents = [0, 1].map(|i| Some(start_agent(&lan, i, &files[i])));
    for (i, agent) in agents.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while lan.nodes[i].map_len("SVC_FRONTENDS").unwrap_or(0) != FRONTENDS {
            let log = agent.as_ref().unwrap().log();
            assert!(
                Instant::now() < deadline,
                "node {}: {:?} frontends; log:\n{log}",
                i + 1,
                lan.nodes[i].map_len("SVC_FRONTENDS")
            );
            sleep(Duration::from_millis(20));
        }
    }
    println!("both nodes programmed {:.1?} after the start", started.elapsed());

    // No kube-proxy: not one rule on either node, in any family.
    for tb in &lan.nodes {
        let ns = &tb.node.name;
        let nft = run_in(ns, "nft", &["list", "ruleset"]).unwrap();
        assert_eq!(String::from_utf8_lossy(&nft.stdout).trim(), "", "{ns} has nft rules");
        for save in ["iptables-save", "ip6tables-save"] {
            let saved = run_in(ns, save, &[]).unwrap();
            assert!(!String::from_utf8_lossy(&saved.stdout).contains("\n-A "), "{ns} has {save} rules");
        }
    }

    let mut failures = Vec::new();
    let mut check = |name: &str, outcome: anyhow::Result<()>| {
        println!(
            "{:<4} {name}{}",
            if outcome.is_ok() { "ok" } else { "FAIL" },
            outcome.as_ref().err().map(|e| format!(": {e:#}")).unwrap_or_default()
        );
        if let Err(e) = outcome {
            failures.push(format!("{name}: {e:#}"));
        }
    };
    let node1 = LanPod { netns: lan.nodes[0].node.name.clone(), ip: LAN_NODE_IPS[0].parse().unwrap(), ip6: None };
    let (n1, n2, n1v6, n2v6) = (ip(LAN_NODE_IPS[0]), ip(LAN_NODE_IPS[1]), ip(LAN_NODE_IPV6S[0]), ip(LAN_NODE_IPV6S[1]));
    let (a4, a6) = (IpAddr::V4(a.ip), IpAddr::V6(a.ip6.unwrap()));

    // Through the socket LB: a client in node `i`'s cgroup, in `pod`'s namespace.
    let cg = &cgroups;
    let ask = |i: usize, pod: &LanPod, mode: &str, to: SocketAddr, saw: Saw| {
        let (host, port) = (to.ip().to_string(), to.port().to_string());
        let mut args = vec![mode, host.as_str(), port.as_str()];
        if mode == "udp" {
            args.extend(["1", "0"]);
        }
        answered(&Client::once(&cg[i], pod, &args), to, saw)
    };
    for (family, vip, me, outside, outside_saw) in [
        ("IPv4", ["10.96.1.1", "10.96.2.1", "10.96.3.1"], a4, "10.96.0.1", n1),
        ("IPv6", ["fd00:10:96::101", "fd00:10:96::201", "fd00:10:96::301"], a6, "fd00:10:96::1", n1v6),
    ] {
        let v = |i: usize, port: u16| at(ip(vip[i]), port);
        for (what, i) in
            [("endpoint on this node", 0), ("endpoint on the other node", 1), ("endpoint is the client itself", 2)]
        {
            check(&format!("{family} pod → ClusterIP, {what} (TCP)"), ask(0, a, "tcp", v(i, 80), Some(me)));
            check(&format!("{family} pod → ClusterIP, {what} (connected UDP)"), ask(0, a, "udp", v(i, 53), Some(me)));
            check(
                &format!("{family} pod → ClusterIP, {what} (unconnected UDP)"),
                ask(0, a, "udp-unconnected", v(i, 53), Some(me)),
            );
        }
        // Masqueraded (ipMasq, both families): the endpoint is outside the cluster.
        let o = |port: u16| at(ip(outside), port);
        check(
            &format!("{family} pod → ClusterIP, endpoint outside the cluster (TCP)"),
            ask(0, a, "tcp", o(443), Some(outside_saw)),
        );
        check(
            &format!("{family} pod → ClusterIP, endpoint outside the cluster (connected UDP)"),
            ask(0, a, "udp", o(53), Some(outside_saw)),
        );
        check(
            &format!("{family} pod → ClusterIP, endpoint outside the cluster (unconnected UDP)"),
            ask(0, a, "udp-unconnected", o(53), Some(outside_saw)),
        );
        let empty = if family == "IPv4" { "10.96.4.1" } else { "fd00:10:96::401" };
        for mode in ["tcp", "udp", "udp-unconnected"] {
            let line = Client::once(&cg[0], a, &[mode, empty, if mode == "tcp" { "80" } else { "53" }]);
            check(&format!("{family} pod → ClusterIP without endpoint, refused at once ({mode})"), refused(&line));
        }
    }
    // The node's own processes (host network) in its cgroup.
    // Toward its own pod the node speaks from whichever address the kernel picks (the testbed
    // gives its namespace one more), so only the answer counts.
    check("node → ClusterIP, endpoint on this node (TCP)", ask(0, &node1, "tcp", at(ip("10.96.1.1"), 80), None));
    check(
        "node → ClusterIP, endpoint on the other node (TCP)",
        ask(0, &node1, "tcp", at(ip("10.96.2.1"), 80), Some(n1)),
    );
    check(
        "node → ClusterIP, endpoint on the other node (connected UDP)",
        ask(0, &node1, "udp", at(ip("10.96.2.1"), 53), Some(n1)),
    );
    // kube-dns: each query a new flow, to either endpoint.
    for query in 1..=6 {
        check(
            &format!("pod → DNS ClusterIP, endpoints on both nodes, query {query}"),
            ask(0, a, "udp", at(ip("10.96.0.10"), 53), Some(a4)),
        );
    }

    // NodePorts. From the LAN (per packet): a local endpoint sees the client, a remote one the
    // node's address (SNAT); no endpoint: a RST at once.
    for (family, node, host_ip) in [("IPv4", n1, ip(LAN_HOST)), ("IPv6", n1v6, ip(LAN_HOST_V6))] {
        let seen = |to: SocketAddr| probe::ask_tcp(&host, to).map(|s| s.ip());
        let expect = |to: SocketAddr, want: IpAddr| -> anyhow::Result<()> {
            let got = seen(to)?;
            anyhow::ensure!(got == want, "the server saw {got}, not {want}");
            Ok(())
        };
        check(&format!("{family} outside → NodePort, endpoint on this node"), expect(at(node, 30080), host_ip));
        check(&format!("{family} outside → NodePort, endpoint on the other node"), expect(at(node, 30081), node));
        check(
            &format!("{family} outside → NodePort without endpoint, RST at once"),
            refused_from_outside(&host, at(node, 30083)),
        );
    }
    // From pods: their own node's NodePort through the socket LB (hairpin included), another
    // node's per packet (masqueraded by the client's node on the way: its destination is outside the cluster).
    for (family, me, node1_ip, node2_ip) in [("IPv4", a4, n1, n2), ("IPv6", a6, n1v6, n2v6)] {
        check(
            &format!("{family} pod → NodePort of its node, endpoint on this node"),
            ask(0, a, "tcp", at(node1_ip, 30080), Some(me)),
        );
        check(
            &format!("{family} pod → NodePort of its node, endpoint is the client (hairpin)"),
            ask(0, a, "tcp", at(node1_ip, 30082), Some(me)),
        );
        check(
            &format!("{family} pod → NodePort of the other node, endpoint there"),
            ask(0, a, "tcp", at(node2_ip, 30081), Some(node1_ip)),
        );
        check(
            &format!("{family} pod of node 2 → node 1's NodePort"),
            ask(1, c, "tcp", at(node1_ip, 30080), Some(node2_ip)),
        );
    }

    // Endpoint churn under traffic: a client opens a connection every 10 ms while the churn
    // Service's endpoints change; no request fails after its one retry, and from 100 ms after
    // each change new connections go only to the endpoints the change left.
    let churn = Client::start(&cg[0], a, &["tcp-loop", "10.96.5.1", "80", "100000", "0.01"]);
    let first = churn.next(Duration::from_secs(3));
    check(
        "churn: the loop's first request",
        if first["reply"] == json!("L") { Ok(()) } else { Err(anyhow::anyhow!("{first}")) },
    );
    let put = |pods: &[(&LanPod, &str)]| {
        let event = monotonic();
        for s in &stores {
            s.put(SLICES, [pod_slices("default/churn", pods, &CHURN)[0].clone()]);
        }
        event
    };
    for (pods, allowed, what) in [
        (&[(b, "node-1"), (c, "node-2")][..], &["L", "R"][..], "L → L, R"),
        (&[(c, "node-2")][..], &["R"][..], "L, R → R"),
        (&[(b, "node-1")][..], &["L"][..], "R → L"),
    ] {
        let event = put(pods);
        let lines = lines_until(&churn, event + 0.5);
        let bad = loop_failures(&lines, event + 0.1, allowed, what);
        let seen: std::collections::BTreeSet<&str> = lines.iter().filter_map(|l| l["reply"].as_str()).collect();
        // The last request the old endpoints answered: how long new connections took to follow.
        let stale = lines.iter().filter(|l| !allowed.contains(&l["reply"].as_str().unwrap_or("")));
        let followed = stale.filter_map(|l| l["t"].as_f64()).fold(event, f64::max) - event;
        println!(
            "churn {what}: {} requests, {} retried, answered by {seen:?}; old endpoints until {:.0} ms after",
            lines.len(),
            retries(&lines),
            followed * 1000.0
        );
        check(
            &format!("churn {what}"),
            if bad.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", bad.join("; "))) },
        );
    }

    // The agent killed (by its PID) and started again while a client loops: no request fails,
    // none even needs its retry (the maps stay pinned, the agent rewrites only what changed).
    let lists_before = stores[0].requests(SLICES).iter().filter(|(v, _)| v.is_none()).count();
    let restart_from = monotonic();
    drop(agents[0].take());
    sleep(Duration::from_millis(300));
    agents[0] = Some(start_agent(&lan, 0, &files[0]));
    let deadline = Instant::now() + Duration::from_secs(5);
    while stores[0].requests(SLICES).iter().filter(|(v, _)| v.is_none()).count() == lists_before {
        assert!(Instant::now() < deadline, "the restarted agent never listed");
        sleep(Duration::from_millis(10));
    }
    sleep(Duration::from_millis(500));
    let lines: Vec<Value> = lines_until(&churn, monotonic())
        .into_iter()
        .filter(|l| l["t"].as_f64().unwrap_or(0.0) >= restart_from)
        .collect();
    drop(churn);
    let mut bad = loop_failures(&lines, restart_from, &["L"], "agent restart");
    if retries(&lines) > 0 {
        bad.push(format!("{} requests needed a retry", retries(&lines)));
    }
    println!("agent restart: {} requests through it", lines.len());
    check(
        "agent restart mid-traffic",
        if bad.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{}", bad.join("; "))) },
    );
    assert_eq!(lan.nodes[0].map_len("SVC_FRONTENDS").unwrap(), FRONTENDS, "after the restart");

    // Nothing left: the agents stopped, every pod DELeted, no program on the cgroups.
    drop(agents);
    drop(servers);
    drop(tagged);
    for (node, pod) in [(0, 0), (0, 1), (1, 0)] {
        lan.del_pod(node, pod).unwrap();
    }
    for (i, tb) in lan.nodes.iter().enumerate() {
        let left = tb.leftovers().unwrap();
        check(
            &format!("node {}: nothing left", i + 1),
            if left.is_empty() { Ok(()) } else { Err(anyhow::anyhow!("{left:?}")) },
        );
        let attached = run("bpftool", &["-j", "cgroup", "show", cgroups[i].path().to_str().unwrap()]).unwrap();
        let attached: Value = serde_json::from_slice(&attached.stdout).unwrap_or(json!([]));
        let count = attached.as_array().map_or(0, Vec::len);
        check(
            &format!("node {}: no program left on its cgroup", i + 1),
            if count == 0 { Ok(()) } else { Err(anyhow::anyhow!("{attached}")) },
        );
    }
    println!("{test}: {} failed, {:.1?}", failures.len(), started.elapsed());
    assert!(failures.is_empty(), "{} checks failed:\n  {}", failures.len(), failures.join("\n  "));
}
