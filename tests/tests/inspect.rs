//! `ebpf-cni inspect` on a live two-node cluster: every view reads what the datapath holds (as
//! the pinned maps and the node's interfaces show it), in table and JSON form; eBPF logs only
//! when the network asks for them.
use std::{
    io::{BufRead as _, BufReader},
    net::{Ipv4Addr, SocketAddrV4},
    os::unix::process::ExitStatusExt as _,
    process::{Command, Stdio},
};

use ebpf_cni_tests::{Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed, traffic};
use ebpf_common::DropReason;
use serde_json::{Value, json};

/// `ebpf-cni inspect <args…>` against `node`'s network.
fn inspect_command(node: &Testbed, args: &[&str]) -> Command {
    let mut command = Command::new(&node.plugin.binary);
    command
        .arg("inspect")
        .args(args)
        .args(["--bpffs-root", node.bpffs_root().to_str().unwrap()])
        .args(["--netns", &format!("/run/netns/{}", node.node.name)]);
    command
}

/// Runs `ebpf-cni inspect <args…>` against `node`'s network; returns (success, stdout, stderr).
fn inspect(node: &Testbed, args: &[&str]) -> (bool, String, String) {
    let out = inspect_command(node, args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn json_view(node: &Testbed, view: &str) -> Vec<Value> {
    let (ok, stdout, stderr) = inspect(node, &[view, "--network", &node.network, "-o", "json"]);
    assert!(ok, "inspect {view}: {stderr}");
    serde_json::from_str::<Value>(&stdout).unwrap().as_array().unwrap().clone()
}

/// An LLDP frame: a protocol the datapath does not forward (dropped as unsupported-protocol).
fn send_lldp(pod_netns: &str) {
    let frame = [[0x01, 0x80, 0xc2, 0, 0, 0x0e], [0x02, 0, 0, 0, 0, 1]].concat();
    let frame = [frame, vec![0x88, 0xcc], vec![0; 46]].concat();
    traffic::PacketSocket::open(pod_netns, "eth0").unwrap().send(&frame).unwrap();
}

fn mac(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[test]
fn every_view_shows_what_the_datapath_holds() {
    let Some(mut c) = Cluster::for_test(
        "every_view_shows_what_the_datapath_holds",
        "insp",
        "10.249.0.0/16",
        ["10.249.1.0/24", "10.249.2.0/24"],
    ) else {
        return;
    };
    c.nodes[0].extra.insert("ebpfLogLevel".into(), json!("debug"));
    let node = &mut c.nodes[0];
    let pods = node.add_attachments(2).unwrap();
    let server = SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 5300);
    let _listener = traffic::udp_socket(&c.ext.name, server).unwrap();
    let client = traffic::udp_socket(&node.pods[0].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 4242)).unwrap();
    client.send_to(b"hello", server).unwrap();
    send_lldp(&node.pods[1].netns.name);

    let endpoints = json_view(node, "endpoints");
    assert_eq!(endpoints.len(), 2, "{endpoints:?}");
    for (row, pod) in endpoints.iter().zip(&pods) {
        assert_eq!(row["ip"], pod.ip.to_string());
        assert_eq!(row["host_ifname"], pod.host_ifname);
        assert_eq!(row["pod_mac"], mac(pod.pod_mac));
        assert_eq!(row["host_mac"], mac(pod.host_mac));
        assert_eq!(row["ifname"], "eth0");
    }
    assert_eq!(endpoints[0]["container_id"], node.pods[0].container_id);

    let nat = json_view(node, "nat");
    let egress = nat.iter().find(|r| r["direction"] == "egress").expect("an egress entry");
    assert_eq!(egress["protocol"], "udp");
    assert_eq!(egress["src"], format!("{}:4242", pods[0].ip));
    assert_eq!(egress["dst"], server.to_string());
    let translated = egress["translated"].as_str().unwrap_or_default();
    let port: u16 = translated.strip_prefix(&format!("{NODE1_UPLINK_IP}:")).and_then(|p| p.parse().ok()).unwrap_or(0);
    assert!((1_024..=29_999).contains(&port), "masqueraded to a port of the default range: {translated}");
    let reply = nat.iter().find(|r| r["direction"] == "reply").expect("a reply entry");
    assert_eq!(reply["translated"], format!("{}:4242", pods[0].ip));
    // Both entries name the masqueraded pod (its owner cookie led to its endpoint and veth).
    for row in [egress, reply] {
        assert_eq!(row["pod"], pods[0].ip.to_string(), "{row}");
        assert_eq!(row["container_id"], node.pods[0].container_id, "{row}");
        assert_eq!(row["ifname"], "eth0", "{row}");
        assert!(row["owner"].as_str().is_some_and(|o| o.parse::<u64>().is_ok()), "{row}");
    }

    // The pods' own IPv6 router solicitations add drops of this reason at any time.
    let before = node.drops(DropReason::UnsupportedProtocol).unwrap();
    let counters = json_view(node, "counters");
    let after = node.drops(DropReason::UnsupportedProtocol).unwrap();
    assert_eq!(counters.len(), DropReason::ALL.len(), "every reason is listed, zero or not");
    let unsupported = counters.iter().find(|r| r["name"] == "unsupported-protocol").unwrap();
    assert_eq!(unsupported["reason"], DropReason::UnsupportedProtocol as u32);
    let packets = unsupported["packets"].as_u64().unwrap();
    assert!(before >= 1 && (before..=after).contains(&packets), "{before} <= {packets} <= {after}");

    let settings = json_view(node, "settings");
    assert_eq!(settings[0]["cluster_cidr"], "10.249.0.0/16");
    assert_eq!(settings[0]["masquerade"], true);
    assert_eq!(settings[0]["uplink"], "uplink0");

    // cls_bpf on every host veth and both ways on the uplink: the same pinned programs.
    let programs = json_view(node, "programs");
    let on = |ifname: &str, hook: &str| {
        programs.iter().find(|r| r["interface"] == ifname && r["hook"] == hook).map(|r| r["ours"].clone())
    };
    for pod in &pods {
        assert_eq!(on(&pod.host_ifname, "tc ingress"), Some(json!("from_pod")), "{programs:?}");
        assert_eq!(on(&pod.host_ifname, "tc egress"), Some(json!("to_pod")), "{programs:?}");
    }
    assert_eq!(on("uplink0", "tc egress"), Some(json!("to_uplink")), "{programs:?}");
    assert_eq!(on("uplink0", "tc ingress"), Some(json!("from_uplink")), "{programs:?}");

    // Tables: a header, then one line per row, every column starting where its header does.
    let (ok, table, _) = inspect(node, &["endpoints"]);
    assert!(ok, "a single network needs no --network");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let column = lines[0].find("HOST VETH").unwrap();
    for (line, pod) in lines[1..].iter().zip(&pods) {
        assert_eq!(line.find(&pod.host_ifname), Some(column), "{table}");
    }
    for view in ["nat", "settings", "programs"] {
        let (ok, table, stderr) = inspect(node, &[view]);
        assert!(ok && table.lines().count() >= 2, "{view}: {table} {stderr}");
        eprintln!("inspect {view}:\n{table}");
    }
    let (_, table, _) = inspect(node, &["nat"]);
    let egress = table.lines().find(|l| l.starts_with("egress")).expect("an egress line");
    assert!(egress.ends_with(&format!("{}  {}", pods[0].ip, node.pods[0].container_id)), "{table}");
    let (_, table, _) = inspect(node, &["counters"]);
    assert!(table.lines().any(|l| l.starts_with("4 ") && l.contains("unsupported-protocol")), "{table}");

    let (ok, logs, stderr) = inspect(node, &["logs"]);
    assert!(ok, "{stderr}");
    assert!(logs.contains("masquerade: new flow"), "{logs}");
    assert!(logs.contains("drop: unsupported-protocol"), "{logs}");

    // Node 2 left ebpfLogLevel at its default: its drops are counted, never logged.
    let node2 = &mut c.nodes[1];
    let pod = node2.new_pod().unwrap();
    node2.add(pod).unwrap();
    send_lldp(&node2.pods[pod].netns.name);
    assert!(node2.drops(DropReason::UnsupportedProtocol).unwrap() >= 1);
    let (ok, logs, stderr) = inspect(node2, &["logs"]);
    assert!(ok && logs.is_empty(), "logs off by default: {logs} {stderr}");
}

#[test]
fn an_unknown_network_is_a_clear_error() {
    let Some(mut node) = Testbed::for_test("an_unknown_network_is_a_clear_error", "inspx", "10.249.9.0/24") else {
        return;
    };
    let (ok, _, stderr) = inspect(&node, &["endpoints"]);
    assert!(!ok && (stderr.contains("no pod has been added yet") || stderr.contains("is a pod running?")), "{stderr}");
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    let (ok, stdout, stderr) = inspect(&node, &["nat", "--network", "nope"]);
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("\"nope\" has no datapath pinned"), "{stderr}");
}

/// `inspect … | head -1`: a reader that goes away ends the output quietly, without a panic.
#[test]
fn a_closed_pipe_ends_output_quietly() {
    let Some(mut node) = Testbed::for_test("a_closed_pipe_ends_output_quietly", "insph", "10.249.8.0/24") else {
        return;
    };
    for _ in 0..2 {
        let pod = node.new_pod().unwrap();
        node.add(pod).unwrap();
    }
    let quiet = |status: std::process::ExitStatus, stderr: &str, what: &str| {
        assert!(status.success() || status.signal() == Some(libc::SIGPIPE), "{what}: {status} {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{what}: {stderr}");
    };

    // As `head -1` does it: read a line, close the pipe.
    let mut child =
        inspect_command(&node, &["endpoints"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("IP "), "{first}");
    let out = child.wait_with_output().unwrap();
    quiet(out.status, &String::from_utf8_lossy(&out.stderr), "endpoints, one line read");

    // The reader already gone before a byte is written: the write itself fails, every time.
    for view in ["endpoints", "nat", "counters", "settings", "programs"] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = inspect_command(&node, &[view, "-o", "json"]).stdout(writer).output().unwrap();
        quiet(out.status, &String::from_utf8_lossy(&out.stderr), view);
    }
}
