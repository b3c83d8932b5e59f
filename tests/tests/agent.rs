//! `ebpf-cni agent`: routes to the other nodes' pod CIDRs follow the Node objects (read from a
//! file holding an API response, and listed then watched on a fake API server over HTTP), pods
//! reach each other across nodes through them (over IPv6 too, on dual-stack nodes), and routes
//! the agent did not make are never touched; nor does a list that looks broken remove any.
use std::{
    net::SocketAddrV4,
    path::Path,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{ApiRequest, Cluster, FakeApi, Say, UNDERLAY_IPS, UNDERLAY_IPV6S, agent::RunningAgent, run_in};
use serde_json::{Value, json};

const SUBNETS: [&str; 2] = ["10.252.1.0/24", "10.252.2.0/24"];

fn node(name: &str, pod_cidr: Option<&str>, ip: &str) -> Value {
    let spec = pod_cidr.map_or(json!({}), |c| json!({ "podCIDR": c, "podCIDRs": [c] }));
    json!({
        "metadata": { "name": name },
        "spec": spec,
        "status": { "addresses": [{ "type": "Hostname", "address": name }, { "type": "InternalIP", "address": ip }] },
    })
}

/// `node(…)` as the API server sends it: with its resource version.
fn versioned(mut node: Value, version: u32) -> Value {
    node["metadata"]["resourceVersion"] = json!(version.to_string());
    node
}

fn node_list(nodes: &[Value]) -> Value {
    json!({ "kind": "NodeList", "apiVersion": "v1", "items": nodes })
}

fn write_nodes(path: &Path, nodes: &[Value]) {
    std::fs::write(path, node_list(nodes).to_string()).unwrap();
}

fn event(kind: &str, object: Value) -> Value {
    json!({ "type": kind, "object": object })
}

/// `ebpf-cni agent --once --node <name> <args…>` in a node's namespace: (success, stderr).
fn agent(c: &Cluster, n: usize, args: &[&str]) -> (bool, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.nodes[n].node.name))
        .arg(&c.nodes[n].plugin.binary)
        .args(["agent", "--once", "--node", &format!("node-{}", n + 1)])
        .arg("--bpffs-root")
        .arg(c.nodes[n].bpffs_root())
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// IPv4 routes in a node's main table as `dst via gw proto p`, sorted.
fn routes(c: &Cluster, n: usize) -> Vec<String> {
    routes_of(c, n, "-4")
}

/// Routes of one family (`-4`, `-6`) in a node's main table as `dst via gw proto p`, sorted.
fn routes_of(c: &Cluster, n: usize, family: &str) -> Vec<String> {
    let out = run_in(&c.nodes[n].node.name, "ip", &[family, "-j", "route", "show", "table", "main"]).unwrap();
    let routes: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut routes: Vec<String> = routes
        .iter()
        .filter(|r| r["gateway"].is_string() && r["dst"] != "default")
        .map(|r| {
            format!(
                "{} via {} proto {}",
                r["dst"].as_str().unwrap(),
                r["gateway"].as_str().unwrap(),
                r["protocol"].as_str().unwrap_or("boot")
            )
        })
        .collect();
    routes.sort();
    routes
}

/// Waits up to 10 s for a node's routes to be `want` (in any order).
fn wait_for_routes(c: &Cluster, n: usize, want: &[&str], agent: &RunningAgent) {
    let mut want: Vec<String> = want.iter().map(ToString::to_string).collect();
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = routes(c, n);
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "routes {now:?}, expected {want:?}; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(100));
    }
}

#[test]
fn routes_follow_the_nodes() {
    let Some(mut c) = Cluster::for_test("routes_follow_the_nodes", "agt", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    // The cluster comes with hand-made routes between its nodes: the agent's job now.
    run_in(&c.nodes[0].node.name, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    run_in(&c.nodes[1].node.name, "ip", &["route", "del", SUBNETS[0]]).unwrap();
    let nodes = c.nodes[0].data_dir().with_file_name("nodes.json");
    let file = nodes.to_str().unwrap();
    let (u1, u2) = (UNDERLAY_IPS[0], UNDERLAY_IPS[1]);
    write_nodes(
        &nodes,
        &[
            node("node-1", Some(SUBNETS[0]), u1),
            node("node-2", Some(SUBNETS[1]), u2),
            node("node-3", None, "192.0.2.99"),
        ],
    );
    for n in 0..2 {
        let (ok, stderr) = agent(&c, n, &["--nodes-file", file]);
        assert!(ok && stderr.contains("1 added"), "node {}: {stderr}", n + 1);
    }
    assert_eq!(routes(&c, 0), [format!("{} via {u2} proto 236", SUBNETS[1])]);
    assert_eq!(routes(&c, 1), [format!("{} via {u1} proto 236", SUBNETS[0])]);

    let mut ips = Vec::new();
    for n in 0..2 {
        let node = &mut c.nodes[n];
        let pod = node.new_pod().unwrap();
        let ip = node.add(pod).unwrap();
        ips.push((node.pods[pod].netns.name.clone(), ip));
    }
    assert!(c.nodes[0].ping(&ips[0].0, &ips[1].1), "pod on node 1 -> pod on node 2 through the agent's route");
    assert!(c.nodes[0].ping(&ips[1].0, &ips[0].1), "and back");

    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && !stderr.contains("added"), "a second sync changes nothing: {stderr}");

    // A route someone else made is never touched; node 2's new CIDR replaces its old one.
    run_in(&c.nodes[0].node.name, "ip", &["route", "add", "10.252.9.0/24", "via", u2]).unwrap();
    let foreign = format!("10.252.9.0/24 via {u2} proto boot");
    write_nodes(&nodes, &[node("node-1", Some(SUBNETS[0]), u1), node("node-2", Some("10.252.5.0/24"), u2)]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok, "{stderr}");
    assert_eq!(routes(&c, 0), [format!("10.252.5.0/24 via {u2} proto 236"), foreign.clone()]);

    // A node whose address is not on a shared segment cannot be routed host-gw: said, and the
    // other routes stay.
    let node1 = node("node-1", Some(SUBNETS[0]), u1);
    write_nodes(
        &nodes,
        &[
            node1.clone(),
            node("node-2", Some("10.252.5.0/24"), u2),
            node("node-4", Some("10.252.4.0/24"), "203.0.113.9"),
        ],
    );
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(!ok && stderr.contains("10.252.4.0/24 via 203.0.113.9"), "{stderr}");
    assert!(stderr.contains("directly connected network"), "{stderr}");
    assert_eq!(routes(&c, 0), [format!("10.252.5.0/24 via {u2} proto 236"), foreign.clone()]);

    // Node 2 moves to another address on the segment: its route's gateway follows.
    write_nodes(&nodes, &[node1.clone(), node("node-2", Some("10.252.5.0/24"), "10.254.0.3")]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("1 changed"), "{stderr}");
    assert_eq!(routes(&c, 0), ["10.252.5.0/24 via 10.254.0.3 proto 236".to_string(), foreign.clone()]);

    // Node 2 leaves the cluster: its route goes.
    write_nodes(&nodes, &[node1]);
    assert!(agent(&c, 0, &["--nodes-file", file]).0);
    assert_eq!(routes(&c, 0), [foreign]);
}

const SUBNETS6: [&str; 2] = ["fd00:10:252:1::/64", "fd00:10:252:2::/64"];

/// A dual-stack node: one pod CIDR and one InternalIP per family, IPv4 first.
fn dual_stack_node(name: &str, pod_cidrs: [&str; 2], ips: [&str; 2]) -> Value {
    json!({
        "metadata": { "name": name },
        "spec": { "podCIDR": pod_cidrs[0], "podCIDRs": pod_cidrs },
        "status": { "addresses": [{ "type": "InternalIP", "address": ips[0] }, { "type": "InternalIP", "address": ips[1] }] },
    })
}

/// Waits up to 5 s for the underlay's link-local addresses to finish duplicate address detection:
/// a node solicits the next hop of a forwarded packet only from a link-local address that passed
/// it, so before then the first packets between pods of the two nodes are lost (1 ping in 2).
fn wait_for_underlay_link_locals(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for tb in &c.nodes {
        let args = ["-6", "addr", "show", "dev", "underlay0", "scope", "link", "tentative"];
        while !run_in(&tb.node.name, "ip", &args).unwrap().stdout.is_empty() {
            assert!(Instant::now() < deadline, "{}: underlay0's link-local address is still tentative", tb.node.name);
            sleep(Duration::from_millis(100));
        }
    }
}

/// ADD on node `n`; the new pod's netns and its IPv6 address (the result's second).
fn add_dual_stack_pod(c: &mut Cluster, n: usize) -> (String, String) {
    let tb = &mut c.nodes[n];
    let pod = tb.new_pod().unwrap();
    let out = tb.cni("ADD", pod, &tb.conf("1.0.0")).unwrap();
    assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
    let ipv6 = out.json()["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    (tb.pods[pod].netns.name.clone(), ipv6)
}

/// Dual-stack nodes: each other node's IPv6 pod CIDR via its IPv6 InternalIP beside the IPv4
/// route, both proto 236, pods talking over IPv6 through them; and the IPv6 routes follow the
/// rules of the IPv4 ones (a gateway that moves, someone else's route left alone, a node that
/// leaves takes both its routes with it).
#[test]
fn routes_both_families_of_dual_stack_nodes() {
    let Some(mut c) = Cluster::for_test("routes_both_families_of_dual_stack_nodes", "agt6", "10.252.0.0/16", SUBNETS)
    else {
        return;
    };
    // Addresses of both families on the underlay (nodad), IPv6 forwarding in the node namespaces.
    c.add_ipv6("fd00:10:252::/56", SUBNETS6).unwrap();
    wait_for_underlay_link_locals(&c);
    // The cluster's hand-made routes, both families: the agent's job now.
    for (n, other) in [(0, 1), (1, 0)] {
        run_in(&c.nodes[n].node.name, "ip", &["route", "del", SUBNETS[other]]).unwrap();
        run_in(&c.nodes[n].node.name, "ip", &["-6", "route", "del", SUBNETS6[other]]).unwrap();
    }
    let nodes = c.nodes[0].data_dir().with_file_name("nodes.json");
    let file = nodes.to_str().unwrap();
    let (u1, u2) = (UNDERLAY_IPS[0], UNDERLAY_IPS[1]);
    let (u1v6, u2v6) = (UNDERLAY_IPV6S[0], UNDERLAY_IPV6S[1]);
    let node1 = dual_stack_node("node-1", [SUBNETS[0], SUBNETS6[0]], [u1, u1v6]);
    write_nodes(&nodes, &[node1.clone(), dual_stack_node("node-2", [SUBNETS[1], SUBNETS6[1]], [u2, u2v6])]);
    for n in 0..2 {
        let (ok, stderr) = agent(&c, n, &["--nodes-file", file]);
        assert!(ok && stderr.contains("2 added"), "node {}: {stderr}", n + 1);
    }
    assert_eq!(routes(&c, 0), [format!("{} via {u2} proto 236", SUBNETS[1])]);
    assert_eq!(routes_of(&c, 0, "-6"), [format!("{} via {u2v6} proto 236", SUBNETS6[1])]);
    assert_eq!(routes(&c, 1), [format!("{} via {u1} proto 236", SUBNETS[0])]);
    assert_eq!(routes_of(&c, 1, "-6"), [format!("{} via {u1v6} proto 236", SUBNETS6[0])]);

    let (ns_a, v6_a) = add_dual_stack_pod(&mut c, 0);
    let (ns_b, v6_b) = add_dual_stack_pod(&mut c, 1);
    let ping6 = |ns: &str, ip: &str| run_in(ns, "ping", &["-6", "-c", "1", "-W", "2", ip]).is_ok();
    assert!(ping6(&ns_a, &v6_b), "pod on node 1 -> pod on node 2 over IPv6 through the agent's route");
    assert!(ping6(&ns_b, &v6_a), "and back");

    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && !stderr.contains("added"), "a second sync changes nothing: {stderr}");

    // Node 2's IPv6 address moves: only its IPv6 route's gateway follows.
    write_nodes(&nodes, &[node1.clone(), dual_stack_node("node-2", [SUBNETS[1], SUBNETS6[1]], [u2, "fd00:10:254::3"])]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("0 added, 1 changed"), "{stderr}");
    assert_eq!(routes(&c, 0), [format!("{} via {u2} proto 236", SUBNETS[1])]);
    assert_eq!(routes_of(&c, 0, "-6"), [format!("{} via fd00:10:254::3 proto 236", SUBNETS6[1])]);

    // Someone else's IPv6 route to a node's pod CIDR stays, and the sync says it could not set
    // its own.
    run_in(&c.nodes[0].node.name, "ip", &["-6", "route", "add", "fd00:10:252:9::/64", "via", u2v6]).unwrap();
    let foreign = format!("fd00:10:252:9::/64 via {u2v6} proto boot");
    let node3 = dual_stack_node("node-3", ["10.252.9.0/24", "fd00:10:252:9::/64"], [u2, u2v6]);
    write_nodes(&nodes, &[node1.clone(), node3]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(!ok && stderr.contains(&format!("{foreign} is there")), "{stderr}");
    assert_eq!(routes(&c, 0), [format!("10.252.9.0/24 via {u2} proto 236")], "node 2 left: its routes went");
    assert_eq!(routes_of(&c, 0, "-6"), std::slice::from_ref(&foreign));

    // Node 3 leaves too: its IPv4 route goes, the IPv6 one that was never the agent's stays.
    write_nodes(&nodes, &[node1]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("1 removed"), "{stderr}");
    assert_eq!(routes(&c, 0), Vec::<String>::new());
    assert_eq!(routes_of(&c, 0, "-6"), [foreign]);
}

/// Routes the agent did not make to destinations nodes want: neither replaced nor deleted, and a
/// sync that had to leave them says so and fails.
#[test]
fn foreign_routes_stay() {
    let Some(c) = Cluster::for_test("foreign_routes_stay", "agtf", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    let nodes = c.nodes[0].data_dir().with_file_name("nodes.json");
    let file = nodes.to_str().unwrap();
    let (u1, u2) = (UNDERLAY_IPS[0], UNDERLAY_IPS[1]);
    // The cluster's hand-made route to node 2's pods (proto boot), and a static one.
    run_in(&c.nodes[0].node.name, "ip", &["route", "add", "10.252.7.0/24", "via", u2, "proto", "static"]).unwrap();
    let theirs = [format!("{} via {u2} proto boot", SUBNETS[1]), format!("10.252.7.0/24 via {u2} proto static")];
    write_nodes(
        &nodes,
        &[
            node("node-1", Some(SUBNETS[0]), u1),
            node("node-2", Some(SUBNETS[1]), "10.254.0.3"),
            node("node-3", Some("10.252.7.0/24"), u2),
            node("node-4", Some("10.252.4.0/24"), u2),
        ],
    );
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains(&format!("{} via {u2} proto boot", SUBNETS[1])), "{stderr}");
    assert!(stderr.contains(&format!("10.252.7.0/24 via {u2} proto static")), "{stderr}");
    assert!(stderr.contains("2 routes could not be set"), "{stderr}");
    let mut want = theirs.to_vec();
    want.push(format!("10.252.4.0/24 via {u2} proto 236"));
    want.sort();
    assert_eq!(routes(&c, 0), want, "the other node's route is set all the same");

    // Nodes 2 and 3 leave: their destinations' routes were never the agent's, so they stay.
    write_nodes(&nodes, &[node("node-1", Some(SUBNETS[0]), u1)]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("1 removed"), "{stderr}");
    assert_eq!(routes(&c, 0), theirs);
}

/// A node list that cannot be the whole cluster (empty, or without the agent's own node) adds
/// routes but removes none.
#[test]
fn incomplete_lists_remove_nothing() {
    let Some(c) = Cluster::for_test("incomplete_lists_remove_nothing", "agte", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    run_in(&c.nodes[0].node.name, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    let nodes = c.nodes[0].data_dir().with_file_name("nodes.json");
    let file = nodes.to_str().unwrap();
    let (u1, u2) = (UNDERLAY_IPS[0], UNDERLAY_IPS[1]);
    write_nodes(&nodes, &[node("node-1", Some(SUBNETS[0]), u1), node("node-2", Some(SUBNETS[1]), u2)]);
    assert!(agent(&c, 0, &["--nodes-file", file]).0);
    let node2 = format!("{} via {u2} proto 236", SUBNETS[1]);
    assert_eq!(routes(&c, 0), [node2.as_str()]);

    write_nodes(&nodes, &[]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("the node list is empty"), "{stderr}");
    assert_eq!(routes(&c, 0), [node2.as_str()]);

    // node-1 is missing (a wrong --node, a partial list): node 2's route stays, node 3's comes.
    write_nodes(&nodes, &[node("node-3", Some("10.252.3.0/24"), u2)]);
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(ok && stderr.contains("this node (node-1) is not in the node list"), "{stderr}");
    assert_eq!(routes(&c, 0), [node2, format!("10.252.3.0/24 via {u2} proto 236")]);
}

#[test]
fn reads_nodes_from_an_api_server() {
    let Some(c) = Cluster::for_test("reads_nodes_from_an_api_server", "agta", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    run_in(&c.nodes[0].node.name, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    let at = SocketAddrV4::new(UNDERLAY_IPS[0].parse().unwrap(), 6443);
    let api = FakeApi::start(&c.nodes[0].node.name, at);
    let nodes = [node("node-1", Some(SUBNETS[0]), UNDERLAY_IPS[0]), node("node-2", Some(SUBNETS[1]), UNDERLAY_IPS[1])];
    api.say(Say::Json(node_list(&nodes).to_string()));
    let (ok, stderr) = agent(&c, 0, &["--api-server", &format!("http://{at}")]);
    assert!(ok, "{stderr}");
    let request = ApiRequest::parse(&api.request());
    assert_eq!((request.method.as_str(), request.path.as_str()), ("GET", "/api/v1/nodes"));
    assert!(!request.query.contains_key("watch"), "a list");
    assert_eq!(routes(&c, 0), [format!("{} via {} proto 236", SUBNETS[1], UNDERLAY_IPS[1])]);
}

/// The running agent lists the nodes once, then follows a watch: changes apply as their events
/// come, a dropped watch resumes from the last resource version seen (a bookmark's too), a
/// DELETED node's route goes, when the server ends a watch the routes are checked again, and a
/// version too old to resume from means a new list.
#[test]
fn follows_a_watch() {
    let Some(c) = Cluster::for_test("follows_a_watch", "agtw", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    let netns = &c.nodes[0].node.name;
    run_in(netns, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    let (u1, u2) = (UNDERLAY_IPS[0], UNDERLAY_IPS[1]);
    let at = SocketAddrV4::new(u1.parse().unwrap(), 6443);
    let api = FakeApi::start(netns, at);
    let agent =
        RunningAgent::start(&c.nodes[0], "node-1", &["--api-server", &format!("http://{at}"), "--interval", "30"])
            .unwrap();
    // What kube's client sends: the list (paged, no watch), then watches from a version, with
    // bookmarks and the --interval as the server's end of each.
    let seen = |request: String, want: Option<&str>| {
        let r = ApiRequest::parse(&request);
        let ok = r.path == "/api/v1/nodes"
            && match want {
                None => !r.query.contains_key("watch"),
                Some(version) => {
                    r.query.get("watch").map(String::as_str) == Some("true")
                        && r.query.get("resourceVersion").map(String::as_str) == Some(version)
                        && r.query.get("allowWatchBookmarks").map(String::as_str) == Some("true")
                        && r.query.get("timeoutSeconds").map(String::as_str) == Some("30")
                }
            };
        assert!(ok, "expected {want:?}, got {request:?}; the agent's log:\n{}", agent.log());
    };

    seen(api.request(), None);
    let mut list = node_list(&[node("node-1", Some(SUBNETS[0]), u1), node("node-2", Some(SUBNETS[1]), u2)]);
    list["metadata"] = json!({ "resourceVersion": "100" });
    api.say(Say::Json(list.to_string()));
    wait_for_routes(&c, 0, &[&format!("{} via {u2} proto 236", SUBNETS[1])], &agent);

    seen(api.request(), Some("100"));
    api.say(Say::Open);
    api.say(Say::Event(event("MODIFIED", versioned(node("node-2", Some("10.252.5.0/24"), u2), 101))));
    let node2 = format!("10.252.5.0/24 via {u2} proto 236");
    wait_for_routes(&c, 0, &[&node2], &agent);
    api.say(Say::Event(event("ADDED", versioned(node("node-3", Some("10.252.3.0/24"), "10.254.0.3"), 102))));
    let node3 = "10.252.3.0/24 via 10.254.0.3 proto 236";
    wait_for_routes(&c, 0, &[&node2, node3], &agent);
    // As the API server sends it: kind and apiVersion (kube's client needs both).
    let bookmark = json!({ "kind": "Node", "apiVersion": "v1", "metadata": { "resourceVersion": "103" } });
    api.say(Say::Event(event("BOOKMARK", bookmark)));
    api.say(Say::Cut(event("MODIFIED", versioned(node("node-3", Some("10.252.3.0/24"), u2), 104))));

    // Back after the connection dropped, from the bookmark's version; the cut event never counted.
    seen(api.request(), Some("103"));
    api.say(Say::Open);
    api.say(Say::Event(event("DELETED", versioned(node("node-3", Some("10.252.3.0/24"), "10.254.0.3"), 105))));
    wait_for_routes(&c, 0, &[&node2], &agent);

    // A route deleted by hand is back when the watch round ends, and the watch goes on.
    run_in(netns, "ip", &["route", "del", "10.252.5.0/24"]).unwrap();
    api.say(Say::End);
    wait_for_routes(&c, 0, &[&node2], &agent);
    seen(api.request(), Some("105"));
    assert!(agent.log().contains("resuming from resource version 103"), "{}", agent.log());

    // The version aged out (410): a new list, whose missing node-2 then loses its route.
    let gone = json!({ "kind": "Status", "code": 410, "message": "too old resource version" });
    api.say(Say::Open);
    api.say(Say::Event(event("ERROR", gone)));
    api.say(Say::End);
    seen(api.request(), None);
    let mut list = node_list(&[node("node-1", Some(SUBNETS[0]), u1)]);
    list["metadata"] = json!({ "resourceVersion": "200" });
    api.say(Say::Json(list.to_string()));
    wait_for_routes(&c, 0, &[], &agent);
    seen(api.request(), Some("200"));
}

/// The installer asks the API server for its own node only, not for the list of all nodes.
#[test]
fn installer_fetches_only_its_node() {
    let Some(c) = Cluster::for_test("installer_fetches_only_its_node", "agti", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    let at = SocketAddrV4::new(UNDERLAY_IPS[0].parse().unwrap(), 6443);
    let api = FakeApi::start(&c.nodes[0].node.name, at);
    api.say(Say::Json(node("node-1", Some(SUBNETS[0]), UNDERLAY_IPS[0]).to_string()));
    let root = c.nodes[0].data_dir().with_file_name("root");
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.nodes[0].node.name))
        .arg(&c.nodes[0].plugin.binary)
        .args(["install", "--node", "node-1", "--api-server", &format!("http://{at}")])
        .args(["--root", root.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let request = ApiRequest::parse(&api.request());
    assert_eq!((request.method.as_str(), request.path.as_str()), ("GET", "/api/v1/nodes/node-1"));
    let conflist: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("etc/cni/net.d/10-ebpf-cni.conflist")).unwrap())
            .unwrap();
    assert_eq!(conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], SUBNETS[0]);
}
