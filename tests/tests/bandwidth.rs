//! The `bandwidth` capability, served by ebpf-cni itself: a pod's ingress and egress limits hold
//! (iperf3 TCP within ±10 % of the limit) on every path its traffic takes: another pod of its
//! node, a pod of the other node (through the node's stack) and the outside (masqueraded), with
//! kube-proxy's INVALID drop in both nodes, for flows the pod opens and flows opened towards it.
//! The egress limit is kept on the node's side: a packet socket with `PACKET_QDISC_BYPASS` in
//! the pod gets no more through than the limit. A pod with an ingress limit only, and a pod
//! without limits, keep the fast path. CHECK sees the limits and a piece removed by hand;
//! `inspect` shows them; DEL, and GC after a killed ADD, leave nothing.
use std::{net::SocketAddrV4, process::Command, thread::sleep, time::Duration};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER, Testbed, bypass, frames, iperf,
    kube_proxy::{self, Flavour},
    run_in,
    traffic::{self, PacketSocket},
};
use ebpf_common::ForwardPath;
use serde_json::{Value, json};

/// What the limited pod may receive and send, bits per second, and the bursts (bits).
const INGRESS_RATE: u64 = 40_000_000;
const EGRESS_RATE: u64 = 20_000_000;
const BURST: u64 = 400_000;
const IPERF_PORT: u16 = 5201;
/// Seconds measured per iperf3 run (after one second left out).
const SECONDS: u32 = 3;
const CLUSTER_CIDR: &str = "10.229.0.0/16";

fn limits() -> Value {
    json!({ "ingressRate": INGRESS_RATE, "ingressBurst": BURST, "egressRate": EGRESS_RATE, "egressBurst": BURST })
}

/// The configuration a runtime passes for a pod with `bandwidth`.
fn conf_with(node: &Testbed, bandwidth: Value) -> Value {
    let mut conf = node.conf("1.0.0");
    conf["capabilities"] = json!({ "bandwidth": true });
    conf["runtimeConfig"] = json!({ "bandwidth": bandwidth });
    conf
}

fn limited_conf(node: &Testbed) -> Value {
    conf_with(node, limits())
}

fn assert_near(measured: f64, limit: u64, what: &str) {
    let ratio = measured / limit as f64;
    eprintln!("{what}: {:.2} Mbit/s against a limit of {} Mbit/s ({ratio:.3}×)", measured / 1e6, limit / 1_000_000);
    assert!((0.9..=1.1).contains(&ratio), "{what}: {:.2} Mbit/s, limit {limit} bit/s", measured / 1e6);
}

/// ADD that must succeed; returns the result and the pod's address.
fn add_with(node: &Testbed, pod: usize, conf: &Value) -> (Value, String) {
    let out = node.cni("ADD", pod, conf).unwrap();
    assert!(out.success, "ADD with limits: {} {}", out.stdout, out.stderr);
    let result = out.json();
    let ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    (result, ip)
}

fn mac(text: &Value) -> [u8; 6] {
    let bytes: Vec<u8> = text.as_str().unwrap().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    bytes.try_into().unwrap()
}

#[test]
fn limits_hold_both_ways_on_every_path() {
    let Some(mut c) = Cluster::for_test(
        "limits_hold_both_ways_on_every_path",
        "bw",
        CLUSTER_CIDR,
        ["10.229.1.0/24", "10.229.2.0/24"],
    ) else {
        return;
    };
    let [node, node2] = &mut c.nodes;
    // conntrack must see both directions of every flow through the stack, or this drops the rest.
    for tb in [&*node, &*node2] {
        kube_proxy::install(&tb.node.name, Flavour::Iptables, CLUSTER_CIDR, &[]).unwrap();
    }
    let (limited, plain, plain2) = (node.new_pod().unwrap(), node.new_pod().unwrap(), node.new_pod().unwrap());
    let ingress_only = node.new_pod().unwrap();
    let (result, limited_ip) = add_with(node, limited, &limited_conf(node));
    let plain_ip = node.add(plain).unwrap();
    let plain2_ip = node.add(plain2).unwrap();
    let ingress_conf = conf_with(node, json!({ "ingressRate": INGRESS_RATE, "ingressBurst": BURST }));
    let (ingress_result, ingress_only_ip) = add_with(node, ingress_only, &ingress_conf);
    let remote = node2.new_pod().unwrap();
    let remote_ip = node2.add(remote).unwrap();
    let ns = |tb: &Testbed, pod: usize| tb.pods[pod].netns.name.clone();
    let limited_ns = ns(node, limited);

    // Each peer serves; the limited pod is the client, sending (egress) or, reversed, receiving.
    let peers = [
        ("another pod of the node", ns(node, plain), plain_ip.clone()),
        ("a pod of the other node", ns(node2, remote), remote_ip.clone()),
        ("the outside, masqueraded", c.ext.name.clone(), EXT_SERVER.to_string()),
    ];
    for (peer, server_ns, server_ip) in &peers {
        for (reverse, limit, direction) in [(false, EGRESS_RATE, "egress"), (true, INGRESS_RATE, "ingress")] {
            let fast_before = node.forwarded(ForwardPath::PodToPod).unwrap();
            let _server = iperf::Server::start(server_ns, server_ip, IPERF_PORT).unwrap();
            let rate = iperf::tcp_rate(&limited_ns, server_ip, IPERF_PORT, SECONDS, reverse).unwrap();
            assert_near(rate, limit, &format!("{direction} of the limited pod, {peer}"));
            if *peer == peers[0].0 {
                // Its packets go through its IFB and the stack, and so do the replies.
                let fast = node.forwarded(ForwardPath::PodToPod).unwrap() - fast_before;
                assert!(fast < 10, "{direction}: a pod with an egress limit took the pod-to-pod fast path ({fast})");
            }
        }
    }
    // Flows opened towards the limited pod: the peer's packets go through the stack too, or its
    // conntrack would first see the limited pod's SYN-ACK (INVALID, dropped).
    for (peer, client_ns) in
        [("another pod of the node", ns(node, plain)), ("a pod of the other node", ns(node2, remote))]
    {
        let _server = iperf::Server::start(&limited_ns, &limited_ip, IPERF_PORT).unwrap();
        let rate = iperf::tcp_rate(&client_ns, &limited_ip, IPERF_PORT, SECONDS, true).unwrap();
        assert_near(rate, EGRESS_RATE, &format!("egress of the limited pod, a flow opened by {peer}"));
    }

    // A pod with an ingress limit only keeps the pod-to-pod fast path (through its host veth's
    // egress, where the TBF is).
    let fast_before = node.forwarded(ForwardPath::PodToPod).unwrap();
    let _server = iperf::Server::start(&ns(node, ingress_only), &ingress_only_ip, IPERF_PORT).unwrap();
    let rate = iperf::tcp_rate(&ns(node, plain), &ingress_only_ip, IPERF_PORT, SECONDS, false).unwrap();
    assert_near(rate, INGRESS_RATE, "ingress of a pod limited only there, another pod of the node");
    let fast = node.forwarded(ForwardPath::PodToPod).unwrap() - fast_before;
    assert!(fast > 1000, "the datapath delivered the pod-to-pod packets itself ({fast})");

    // A pod without limits: no TBF, full speed, the pod-to-pod fast path.
    let qdiscs = run_in(&node.node.name, "tc", &["qdisc", "show"]).unwrap();
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout).into_owned();
    assert_eq!(qdiscs.matches("qdisc tbf").count(), 3, "TBFs: two host veths and one IFB: {qdiscs}");
    let ifbs = node.ifbs().unwrap();
    assert_eq!(ifbs.len(), 1, "one IFB, the pod's with an egress limit: {ifbs:?}");
    let fast_before = node.forwarded(ForwardPath::PodToPod).unwrap();
    let _server = iperf::Server::start(&ns(node, plain2), &plain2_ip, IPERF_PORT).unwrap();
    let rate = iperf::tcp_rate(&ns(node, plain), &plain2_ip, IPERF_PORT, 1, false).unwrap();
    assert!(rate > 50.0 * INGRESS_RATE as f64, "an unlimited pod got {:.0} Mbit/s", rate / 1e6);
    let fast = node.forwarded(ForwardPath::PodToPod).unwrap() - fast_before;
    assert!(fast > 1000, "unlimited pods: the datapath delivered the pod-to-pod packets itself ({fast})");

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
    let mut ingress_check = ingress_conf.clone();
    ingress_check["prevResult"] = ingress_result;
    let out = node.cni("CHECK", ingress_only, &ingress_check).unwrap();
    assert!(out.success, "CHECK of a pod limited on ingress only: {} {}", out.stdout, out.stderr);

    // inspect shows the limits beside the pod's endpoint, and the IFB holding the egress one.
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
    assert_eq!(row["egress_ifb"], json!(ifbs[0]));
    for ip in [&plain_ip, &ingress_only_ip] {
        let other_row = rows.as_array().unwrap().iter().find(|r| r["ip"] == json!(ip)).unwrap();
        assert!(other_row.get("egress_limit").is_none() && other_row.get("egress_ifb").is_none(), "{other_row}");
    }

    // Each piece of the egress limit removed by hand, then the ingress limit.
    let host_veth = row["host_ifname"].as_str().unwrap().to_string();
    let tc = |args: &[&str]| run_in(&node.node.name, "tc", args).unwrap();
    tc(&["filter", "del", "dev", &host_veth, "ingress", "pref", "65535"]);
    let out = node.cni("CHECK", limited, &check).unwrap();
    assert_eq!(out.code(), Some(104), "CHECK after the IFB's filter was removed: {}", out.stdout);
    assert!(out.stdout.contains("sends the pod's packets to ecnb"), "{}", out.stdout);
    tc(&["qdisc", "del", "dev", &ifbs[0], "root"]);
    let out = node.cni("CHECK", limited, &check).unwrap();
    assert_eq!(out.code(), Some(104), "CHECK after the IFB's TBF was removed: {}", out.stdout);
    assert!(out.stdout.contains("the pod's egress) has no bandwidth limit"), "{}", out.stdout);
    tc(&["qdisc", "del", "dev", &host_veth, "root"]);
    let out = node.cni("CHECK", limited, &check).unwrap();
    assert_eq!(out.code(), Some(104), "CHECK after the ingress limit was removed: {}", out.stdout);
    assert!(out.stdout.contains("no bandwidth limit"), "{}", out.stdout);

    for pod in [limited, plain, plain2, ingress_only] {
        node.del(pod).unwrap();
    }
    node2.del(remote).unwrap();
    for tb in [&*node, &*node2] {
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    }
}

/// The attack: a pod limited to 10 Mbit/s egress floods from a packet socket with
/// `PACKET_QDISC_BYPASS`, which skips every qdisc of its own interface, to another pod of the
/// node, a pod of the other node and the outside (masqueraded). Each receiver gets no more than
/// the limit (+10 %, and the burst and queue the TBF lets through). Before the limit moved to
/// the node's side, the receivers got 1.7–2.2 Gbit/s.
#[test]
fn a_packet_socket_cannot_bypass_the_egress_limit() {
    const RATE: u64 = 10_000_000;
    const FLOOD_BURST: u64 = 100_000;
    const FLOOD: Duration = Duration::from_secs(2);
    let Some(mut c) = Cluster::for_test(
        "a_packet_socket_cannot_bypass_the_egress_limit",
        "bwraw",
        "10.228.0.0/16",
        ["10.228.1.0/24", "10.228.2.0/24"],
    ) else {
        return;
    };
    let [node, node2] = &mut c.nodes;
    let (limited, plain) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let conf = conf_with(node, json!({ "egressRate": RATE, "egressBurst": FLOOD_BURST }));
    let (result, limited_ip) = add_with(node, limited, &conf);
    let (host_mac, pod_mac) = (mac(&result["interfaces"][0]["mac"]), mac(&result["interfaces"][1]["mac"]));
    let plain_ip = node.add(plain).unwrap();
    let remote = node2.new_pod().unwrap();
    let remote_ip = node2.add(remote).unwrap();
    let limited_ns = node.pods[limited].netns.name.clone();
    let frame_to = |dst: &str| {
        let ip = frames::ipv4_udp(limited_ip.parse().unwrap(), dst.parse().unwrap(), &[0x5a; 1400]);
        frames::with_checksums([frames::ethernet(host_mac, pod_mac, 0x0800), ip].concat())
    };

    let receivers = [
        ("another pod of the node", node.pods[plain].netns.name.clone(), plain_ip.clone()),
        ("a pod of the other node", node2.pods[remote].netns.name.clone(), remote_ip.clone()),
        ("the outside, masqueraded", c.ext.name.clone(), EXT_SERVER.to_string()),
    ];
    // Every path measured first, then judged: the figures of all three are printed either way.
    let mut measured = Vec::new();
    for (receiver, receiver_ns, dst) in &receivers {
        let before = bypass::rx_bytes(receiver_ns, "eth0").unwrap();
        let flood = bypass::flood(&limited_ns, "eth0", frame_to(dst), FLOOD).unwrap();
        // What the TBF's queue still held drains within its 25 ms.
        sleep(Duration::from_millis(300));
        let got = (bypass::rx_bytes(receiver_ns, "eth0").unwrap() - before) as f64 * 8.0;
        let seconds = flood.elapsed.as_secs_f64();
        eprintln!(
            "packet socket with PACKET_QDISC_BYPASS, egress limit {} Mbit/s, to {receiver}: sent {:.0} Mbit/s, \
             received {:.2} Mbit/s ({:.3}× the limit)",
            RATE / 1_000_000,
            flood.bits_per_second() / 1e6,
            got / seconds / 1e6,
            got / seconds / RATE as f64
        );
        measured.push((receiver, flood, got, seconds));
    }
    for (receiver, flood, got, seconds) in measured {
        assert!(flood.bits_per_second() > 20.0 * RATE as f64, "the flood itself was too slow to tell: {flood:?}");
        // The limit, 10 % over it, the burst, and the queue (25 ms at the rate) on top.
        let allowed = 1.1 * RATE as f64 * seconds + FLOOD_BURST as f64 + RATE as f64 * 0.025;
        assert!(got <= allowed, "{receiver} received {got:.0} bits in {seconds:.2} s; at most {allowed:.0} allowed");
        assert!(got >= 0.5 * RATE as f64 * seconds, "{receiver} got almost nothing ({got:.0} bits)");
    }

    // Each frame passes `from_pod` once: the IFB hands it back to the host veth's ingress marked
    // to skip the hook's filters (tc_skip_classify), so neither `from_pod` nor the filter feeding
    // the IFB sees it twice, and the node's stack delivers it.
    let socket = PacketSocket::open(&limited_ns, "eth0").unwrap();
    let at = SocketAddrV4::new(plain_ip.parse().unwrap(), 4000);
    let receiver = traffic::udp_socket(&node.pods[plain].netns.name, at).unwrap();
    let to_stack = node.forwarded(ForwardPath::ToStack).unwrap();
    for _ in 0..50 {
        socket.send(&frame_to(&plain_ip)).unwrap();
        sleep(Duration::from_millis(2));
    }
    for _ in 0..50 {
        traffic::recv_udp(&receiver).expect("every frame arrives");
    }
    receiver.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(traffic::recv_udp(&receiver).is_err(), "a frame arrived twice");
    assert_eq!(node.forwarded(ForwardPath::ToStack).unwrap() - to_stack, 50, "from_pod ran once per frame");

    node.del(limited).unwrap();
    node.del(plain).unwrap();
    node2.del(remote).unwrap();
    for tb in [&*node, &*node2] {
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    }
}

/// An ADD with an egress limit killed right after it created the IFB (before labelling it): DEL
/// removes the IFB, and so does GC, which finds it through the pod's IP reservation.
#[test]
fn an_interrupted_limited_add_leaves_no_ifb() {
    let Some(mut tb) = Testbed::for_test("an_interrupted_limited_add_leaves_no_ifb", "bwkill", "10.229.4.0/24") else {
        return;
    };
    let mut conf = conf_with(&tb, json!({ "egressRate": EGRESS_RATE, "egressBurst": BURST }));
    conf["cniVersion"] = json!("1.1.0");
    let die = [("EBPF_CNI_DIE_AT", "add:after-ifb")];
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    let out = tb.cni_env("ADD", pod, &conf, &netns, &die).unwrap();
    assert_eq!(out.killed_by, Some(9), "ADD was not killed at add:after-ifb: {} {}", out.stdout, out.stderr);
    assert_eq!(tb.ifbs().unwrap().len(), 1, "the killed ADD made its IFB");
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());

    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    let out = tb.cni_env("ADD", pod, &conf, &netns, &die).unwrap();
    assert_eq!(out.killed_by, Some(9), "{} {}", out.stdout, out.stderr);
    let mut gc = tb.conf("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = tb.cni_env("GC", pod, &gc, "", &[]).unwrap();
    assert!(out.success, "GC: {} {}", out.stdout, out.stderr);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
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

/// A network whose datapath 5b4a135 loaded (layout v3, the previous one, kept across a node
/// upgrade until its last pod is gone) has no egress shaping in `from_pod`: an egress limit
/// there would hold only for traffic through the stack. Refused, nothing left. The plugin goes
/// by the `FEATURES` bits whatever the layout, so this build's own pins stand in for 5b4a135's.
#[test]
fn an_egress_limit_is_refused_on_a_datapath_loaded_without_egress_shaping() {
    let Some(mut tb) = Testbed::for_test(
        "an_egress_limit_is_refused_on_a_datapath_loaded_without_egress_shaping",
        "bwold",
        "10.229.5.0/24",
    ) else {
        return;
    };
    let first = tb.new_pod().unwrap();
    tb.add(first).unwrap();
    // What 5b4a135 leaves: no FEATURES bits (it has no such map; a zero reads the same, and
    // `has_feature` treats a missing map as no bits).
    let data = aya::maps::MapData::from_pin(tb.map_pin("FEATURES")).unwrap();
    let mut features: aya::maps::Array<_, u64> = aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
    features.set(0, 0, 0).unwrap();

    let pod = tb.new_pod().unwrap();
    let out = tb.cni("ADD", pod, &conf_with(&tb, json!({ "egressRate": EGRESS_RATE, "egressBurst": BURST }))).unwrap();
    assert_eq!(out.code(), Some(102), "{}", out.stdout);
    assert!(out.stdout.contains("earlier build"), "{}", out.stdout);
    tb.del(pod).unwrap();
    assert!(tb.ifbs().unwrap().is_empty(), "the refused ADD left its IFB");
    assert_eq!(tb.host_veths().unwrap().len(), 1, "the refused ADD left its veth");
    // An ingress limit needs nothing new of the programs.
    let (_, _) = add_with(&tb, pod, &conf_with(&tb, json!({ "ingressRate": INGRESS_RATE, "ingressBurst": BURST })));
    for p in [first, pod] {
        tb.del(p).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
