//! The `bandwidth` capability, served by ebpf-cni itself: a pod's ingress and egress limits hold
//! (iperf3 TCP within ±10 % of the limit) on every path its traffic takes: another pod of its
//! node (the datapath delivers those packets itself), a pod of the other node (through the
//! node's stack) and the outside (masqueraded). A pod without limits keeps the fast path. CHECK
//! sees the limits and a limit removed by hand; `inspect` shows them; DEL leaves nothing.
use std::process::Command;

use ebpf_cni_tests::{Cluster, EXT_SERVER, Testbed, iperf, run_in};
use ebpf_common::ForwardPath;
use serde_json::{Value, json};

/// What the limited pod may receive and send, bits per second, and the bursts (bits).
const INGRESS_RATE: u64 = 40_000_000;
const EGRESS_RATE: u64 = 20_000_000;
const BURST: u64 = 400_000;
const IPERF_PORT: u16 = 5201;
/// Seconds measured per iperf3 run (after one second left out).
const SECONDS: u32 = 3;

fn limits() -> Value {
    json!({ "ingressRate": INGRESS_RATE, "ingressBurst": BURST, "egressRate": EGRESS_RATE, "egressBurst": BURST })
}

/// The configuration a runtime passes for a pod with `limits`.
fn limited_conf(node: &Testbed) -> Value {
    let mut conf = node.conf("1.0.0");
    conf["capabilities"] = json!({ "bandwidth": true });
    conf["runtimeConfig"] = json!({ "bandwidth": limits() });
    conf
}

fn assert_near(measured: f64, limit: u64, what: &str) {
    let ratio = measured / limit as f64;
    eprintln!("{what}: {:.2} Mbit/s against a limit of {} Mbit/s ({ratio:.3}×)", measured / 1e6, limit / 1_000_000);
    assert!((0.9..=1.1).contains(&ratio), "{what}: {:.2} Mbit/s, limit {limit} bit/s", measured / 1e6);
}

#[test]
fn limits_hold_both_ways_on_every_path() {
    let Some(mut c) = Cluster::for_test(
        "limits_hold_both_ways_on_every_path",
        "bw",
        "10.229.0.0/16",
        ["10.229.1.0/24", "10.229.2.0/24"],
    ) else {
        return;
    };
    let [node, node2] = &mut c.nodes;
    let (limited, plain, plain2) = (node.new_pod().unwrap(), node.new_pod().unwrap(), node.new_pod().unwrap());
    let out = node.cni("ADD", limited, &limited_conf(node)).unwrap();
    assert!(out.success, "ADD with limits: {} {}", out.stdout, out.stderr);
    let result = out.json();
    let limited_ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    let plain_ip = node.add(plain).unwrap();
    let plain2_ip = node.add(plain2).unwrap();
    let remote = node2.new_pod().unwrap();
    let remote_ip = node2.add(remote).unwrap();
    let ns = |tb: &Testbed, pod: usize| tb.pods[pod].netns.name.clone();
    let limited_ns = ns(node, limited);

    // Each peer serves; the limited pod is the client, sending (egress) or, reversed, receiving.
    let peers = [
        ("another pod of the node", ns(node, plain), plain_ip.clone()),
        ("a pod of the other node", ns(node2, remote), remote_ip),
        ("the outside, masqueraded", c.ext.name.clone(), EXT_SERVER.to_string()),
    ];
    for (peer, server_ns, server_ip) in &peers {
        for (reverse, limit, direction) in [(false, EGRESS_RATE, "egress"), (true, INGRESS_RATE, "ingress")] {
            let fast_before = node.forwarded(ForwardPath::PodToPod).unwrap();
            let _server = iperf::Server::start(server_ns, server_ip, IPERF_PORT).unwrap();
            let rate = iperf::tcp_rate(&limited_ns, server_ip, IPERF_PORT, SECONDS, reverse).unwrap();
            assert_near(rate, limit, &format!("{direction} of the limited pod, {peer}"));
            if *peer == peers[0].0 {
                let fast = node.forwarded(ForwardPath::PodToPod).unwrap() - fast_before;
                assert!(fast > 1000, "{direction}: the datapath delivered the pod-to-pod packets itself ({fast})");
            }
        }
    }

    // A pod without limits: no TBF, full speed, the pod-to-pod fast path.
    let qdiscs = run_in(&node.node.name, "tc", &["qdisc", "show"]).unwrap();
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout).into_owned();
    assert_eq!(qdiscs.matches("qdisc tbf").count(), 1, "only the limited pod's host veth has a TBF: {qdiscs}");
    let _server = iperf::Server::start(&ns(node, plain2), &plain2_ip, IPERF_PORT).unwrap();
    let rate = iperf::tcp_rate(&ns(node, plain), &plain2_ip, IPERF_PORT, 1, false).unwrap();
    assert!(rate > 50.0 * INGRESS_RATE as f64, "an unlimited pod got {:.0} Mbit/s", rate / 1e6);

    // CHECK sees the limits, and a limit gone.
    let mut check = limited_conf(node);
    check["prevResult"] = result.clone();
    let out = node.cni("CHECK", limited, &check).unwrap();
    assert!(out.success, "CHECK of a limited pod: {} {}", out.stdout, out.stderr);
    let mut other = check.clone();
    other["runtimeConfig"]["bandwidth"]["egressRate"] = json!(EGRESS_RATE * 2);
    let out = node.cni("CHECK", limited, &other).unwrap();
    assert_eq!(out.code(), Some(104), "CHECK against another egress rate: {}", out.stdout);
    assert!(out.stdout.contains("limited to 20000000 bit/s"), "{}", out.stdout);

    // inspect shows the limits beside the pod's endpoint.
    let inspect = Command::new(&node.plugin.binary)
        .args(["inspect", "endpoints", "--network", &node.network, "-o", "json"])
        .args(["--bpffs-root", node.bpffs_root().to_str().unwrap()])
        .args(["--netns", &format!("/run/netns/{}", node.node.name)])
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let row = rows.as_array().unwrap().iter().find(|r| r["ip"] == json!(limited_ip)).expect("the limited pod's row");
    assert_eq!(row["ingress_limit"], json!({ "rate_bits_per_second": INGRESS_RATE, "burst_bits": BURST }));
    assert_eq!(row["egress_limit"], json!({ "rate_bits_per_second": EGRESS_RATE, "burst_bits": BURST }));
    let plain_row = rows.as_array().unwrap().iter().find(|r| r["ip"] == json!(plain_ip)).unwrap();
    assert!(plain_row.get("ingress_limit").is_none(), "{plain_row}");

    let host_veth = row["host_ifname"].as_str().unwrap().to_string();
    run_in(&node.node.name, "tc", &["qdisc", "del", "dev", &host_veth, "root"]).unwrap();
    let out = node.cni("CHECK", limited, &check).unwrap();
    assert_eq!(out.code(), Some(104), "CHECK after the ingress limit was removed: {}", out.stdout);
    assert!(out.stdout.contains("no bandwidth limit"), "{}", out.stdout);

    for pod in [limited, plain, plain2] {
        node.del(pod).unwrap();
    }
    node2.del(remote).unwrap();
    for tb in [&*node, &*node2] {
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    }
}

#[test]
fn bad_limits_are_refused_and_leave_nothing() {
    let Some(mut tb) = Testbed::for_test("bad_limits_are_refused_and_leave_nothing", "bwbad", "10.229.3.0/24") else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    for (bandwidth, says) in [
        (json!({ "ingressRate": 1_000_000 }), "without ingressBurst"),
        (json!({ "egressRate": 1_000_000, "egressBurst": 800 }), "less than one"),
        (json!({ "egressRate": "1M", "egressBurst": 800_000 }), "whole number"),
    ] {
        let mut conf = tb.conf("1.0.0");
        conf["runtimeConfig"] = json!({ "bandwidth": bandwidth });
        let out = tb.cni("ADD", pod, &conf).unwrap();
        assert_eq!(out.code(), Some(7), "{bandwidth}: {}", out.stdout);
        assert!(out.stdout.contains(says), "{bandwidth}: {}", out.stdout);
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
        assert!(tb.host_veths().unwrap().is_empty());
    }
}
