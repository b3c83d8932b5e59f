//! `ebpf-cni agent`: routes to the other nodes' pod CIDRs follow the Node objects (read from a
//! file holding an API response, and from a fake API server over HTTP), pods reach each other
//! across nodes through them, and routes the agent did not make are never touched.
use std::{
    io::{Read as _, Write as _},
    net::SocketAddrV4,
    path::Path,
    process::Command,
};

use ebpf_cni_tests::{Cluster, UNDERLAY_IPS, run_in, traffic};
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

fn write_nodes(path: &Path, nodes: &[Value]) {
    std::fs::write(path, json!({ "kind": "NodeList", "apiVersion": "v1", "items": nodes }).to_string()).unwrap();
}

/// `ebpf-cni agent --once --node <name> <args…>` in a node's namespace: (success, stderr).
fn agent(c: &Cluster, n: usize, args: &[&str]) -> (bool, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.nodes[n].node.name))
        .arg(&c.nodes[n].plugin.binary)
        .args(["agent", "--once", "--node", &format!("node-{}", n + 1)])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Routes in a node's main table as `dst via gw proto p`.
fn routes(c: &Cluster, n: usize) -> Vec<String> {
    let out = run_in(&c.nodes[n].node.name, "ip", &["-j", "route", "show", "table", "main"]).unwrap();
    let routes: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    routes
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
        .collect()
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
    write_nodes(
        &nodes,
        &[node("node-2", Some("10.252.5.0/24"), u2), node("node-4", Some("10.252.4.0/24"), "203.0.113.9")],
    );
    let (ok, stderr) = agent(&c, 0, &["--nodes-file", file]);
    assert!(!ok && stderr.contains("10.252.4.0/24 via 203.0.113.9"), "{stderr}");
    assert_eq!(routes(&c, 0), [format!("10.252.5.0/24 via {u2} proto 236"), foreign.clone()]);

    // Node 2 leaves the cluster: its route goes.
    write_nodes(&nodes, &[node("node-1", Some(SUBNETS[0]), u1)]);
    assert!(agent(&c, 0, &["--nodes-file", file]).0);
    assert_eq!(routes(&c, 0), [foreign]);
}

#[test]
fn reads_nodes_from_an_api_server() {
    let Some(c) = Cluster::for_test("reads_nodes_from_an_api_server", "agta", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    run_in(&c.nodes[0].node.name, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    let body = json!({ "kind": "NodeList", "items": [node("node-2", Some(SUBNETS[1]), UNDERLAY_IPS[1])] }).to_string();
    let at = SocketAddrV4::new(UNDERLAY_IPS[0].parse().unwrap(), 6443);
    let server = serve_once(&c.nodes[0].node.name, at, body);
    let (ok, stderr) = agent(&c, 0, &["--api-server", &format!("http://{at}")]);
    let request = server.join().unwrap();
    assert!(ok, "{stderr}");
    assert!(request.starts_with("GET /api/v1/nodes HTTP/1.1\r\n"), "{request}");
    assert_eq!(routes(&c, 0), [format!("{} via {} proto 236", SUBNETS[1], UNDERLAY_IPS[1])]);
}

/// A fake API server: answers one request with `body`; returns the request it got.
fn serve_once(netns: &str, at: SocketAddrV4, body: String) -> std::thread::JoinHandle<String> {
    let listener = traffic::tcp_listener(netns, at).unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buf = [0; 4096];
        while !request.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "request cut short");
            request.extend_from_slice(&buf[..n]);
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        String::from_utf8(request).unwrap()
    })
}

/// The installer asks the API server for its own node only, not for the list of all nodes.
#[test]
fn installer_fetches_only_its_node() {
    let Some(c) = Cluster::for_test("installer_fetches_only_its_node", "agti", "10.252.0.0/16", SUBNETS) else {
        return;
    };
    let at = SocketAddrV4::new(UNDERLAY_IPS[0].parse().unwrap(), 6443);
    let server = serve_once(&c.nodes[0].node.name, at, node("node-1", Some(SUBNETS[0]), UNDERLAY_IPS[0]).to_string());
    let root = c.nodes[0].data_dir().with_file_name("root");
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.nodes[0].node.name))
        .arg(&c.nodes[0].plugin.binary)
        .args(["install", "--node", "node-1", "--api-server", &format!("http://{at}")])
        .args(["--root", root.to_str().unwrap()])
        .output()
        .unwrap();
    let request = server.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(request.starts_with("GET /api/v1/nodes/node-1 HTTP/1.1\r\n"), "{request}");
    let conflist: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("etc/cni/net.d/10-ebpf-cni.conflist")).unwrap())
            .unwrap();
    assert_eq!(conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], SUBNETS[0]);
}
