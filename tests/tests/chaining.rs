//! ebpf-cni as the first plugin of a conflist, its result feeding the reference `portmap`,
//! `bandwidth` and `tuning` plugins (Debian's, spec ≤ 1.0.0): ADD, CHECK and DEL of the whole
//! chain, a host port reachable from outside, and nothing left afterwards. A pod that asks the
//! chained `bandwidth` for limits fails ADD, whichever direction: its egress limit needs the host
//! veth's ingress qdisc slot, which our clsact qdisc holds, and its ingress limit the root slot,
//! which ebpf-cni holds too, because a TBF there would miss what the programs deliver
//! themselves. ebpf-cni serves the `bandwidth` capability itself (`bandwidth.rs`).
use std::net::{Ipv4Addr, SocketAddrV4};

use ebpf_cni_tests::{
    Cluster, EXT_UPLINK_IP, NODE1_UPLINK_IP, run_in,
    runtime::{NetworkList, Runtime, Sandbox},
    traffic::{self, ask_tcp, serve_tcp},
};
use serde_json::json;

const TUNED_MAC: &str = "c2:aa:bb:cc:dd:ee";

#[test]
fn portmap_bandwidth_and_tuning_chain_after_ebpf_cni() {
    let Some(mut c) = Cluster::for_test(
        "portmap_bandwidth_and_tuning_chain_after_ebpf_cni",
        "chain",
        "10.232.0.0/16",
        ["10.232.1.0/24", "10.232.2.0/24"],
    ) else {
        return;
    };
    let node = &mut c.nodes[0];
    let rt = Runtime::for_testbed(node);
    let mut conflist = node.conflist(
        "1.1.0",
        vec![
            json!({ "type": "portmap", "capabilities": { "portMappings": true } }),
            json!({ "type": "bandwidth", "capabilities": { "bandwidth": true } }),
            json!({ "type": "tuning", "mac": TUNED_MAC, "sysctl": { "net.core.somaxconn": "512" } }),
        ],
    );
    conflist["cniVersions"] = json!(["0.4.0", "1.0.0", "1.1.0"]);
    let list = rt.load(&conflist).unwrap();
    assert_eq!(list.cni_version, "1.0.0", "the reference plugins speak up to 1.0.0");
    let plain = rt.load(&node.conflist("1.0.0", vec![])).unwrap();

    let (web, client) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let mut sb = node.sandbox(web);
    sb.capability_args
        .insert("portMappings".into(), json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }]));
    let result = rt.add(&list, &sb).unwrap();
    assert_eq!(result["cniVersion"], "1.0.0");
    let web_ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    assert_eq!(result["interfaces"][1]["mac"], TUNED_MAC, "tuning's MAC is in the chain's result");
    check_chain(&rt, &list, &sb);
    let client_sb = node.sandbox(client);
    rt.add(&plain, &client_sb).unwrap();

    // The host port, from outside: portmap's DNAT in the node, then our /32 route to the pod.
    let web_ns = node.pods[web].netns.name.clone();
    let listener = traffic::tcp_listener(&web_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80)).unwrap();
    let served = serve_tcp(listener, 2);
    let host_port = SocketAddrV4::new(NODE1_UPLINK_IP.parse().unwrap(), 8080);
    let seen = ask_tcp(&mut traffic::tcp_connect(&c.ext.name, 0, host_port).unwrap()).unwrap();
    assert!(seen.starts_with(&format!("{EXT_UPLINK_IP}:")), "through the host port the pod saw {seen}");
    // Pod to pod, though tuning changed the pod's MAC after ebpf-cni recorded it.
    let seen = ask_tcp(
        &mut traffic::tcp_connect(&node.pods[client].netns.name, 0, SocketAddrV4::new(web_ip.parse().unwrap(), 80))
            .unwrap(),
    )
    .unwrap();
    assert!(seen.starts_with("10.232.1."), "pod to pod: the server saw {seen}");
    served.join().unwrap().unwrap();
    // tuning set the pod's sysctl.
    let somaxconn = run_in(&web_ns, "sysctl", &["-n", "net.core.somaxconn"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&somaxconn.stdout).trim(), "512");

    rt.del(&plain, &client_sb).unwrap();
    rt.del(&list, &sb).unwrap();
    assert_eq!(node.leftovers().unwrap(), Vec::<String>::new());

    // Limits through the chained plugin, both ways or one: bandwidth's ADD fails, and the
    // runtime's DEL of the chain leaves nothing (no veth, no IFB of bandwidth's).
    let both = json!({ "ingressRate": 1_000_000_000u64, "ingressBurst": 100_000_000u64,
                       "egressRate": 1_000_000_000u64, "egressBurst": 100_000_000u64 });
    let ingress = json!({ "ingressRate": 1_000_000_000u64, "ingressBurst": 100_000_000u64 });
    let egress = json!({ "egressRate": 1_000_000_000u64, "egressBurst": 100_000_000u64 });
    for limits in [both, ingress, egress] {
        let limited = node.new_pod().unwrap();
        let mut sb = node.sandbox(limited);
        sb.capability_args.insert("bandwidth".into(), limits.clone());
        let err = rt.add(&list, &sb).unwrap_err().to_string();
        assert!(err.contains("bandwidth") && err.contains("qdisc"), "{limits}: {err}");
        assert_eq!(node.leftovers().unwrap(), Vec::<String>::new(), "{limits}");
        let links = run_in(&node.node.name, "ip", &["-o", "link", "show"]).unwrap();
        assert!(!String::from_utf8_lossy(&links.stdout).contains("bwp"), "{limits}: bandwidth's IFB outlived DEL");
    }
    let rules = run_in(&node.node.name, "iptables-save", &[]).unwrap();
    assert!(!String::from_utf8_lossy(&rules.stdout).contains("8080"), "portmap's DNAT outlived DEL");
}

/// CHECK of every plugin with the cached result. Two bugs of Debian's plugins (1.1.1) are
/// accepted, nothing else: portmap fails CHECK for a pod without IPv6 by looking for an
/// ip6tables chain it never made (containernetworking/plugins#819, fixed upstream later), and
/// bandwidth dereferences a nil pointer in CHECK of a pod that asked for no limits.
fn check_chain(rt: &Runtime, list: &NetworkList, sb: &Sandbox) {
    let cached = rt.cached(sb).expect("cached ADD result");
    for plugin in &list.plugins {
        let out = rt.invoke(list, plugin, "CHECK", Some(sb), &[("prevResult", cached.clone())]).unwrap();
        let known_bug = (plugin["type"] == "portmap" && out.stdout.contains("could not check ipv6 dnat"))
            || (plugin["type"] == "bandwidth" && out.stderr.contains("nil pointer dereference"));
        assert!(out.success || known_bug, "CHECK of {}: {} {}", plugin["type"], out.stdout, out.stderr);
    }
}
