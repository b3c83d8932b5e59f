//! Issue 25, connect-time Service translation (the socket LB): node 1 of a dual-stack LAN with
//! `kubeProxyReplacement` in its node file and not one iptables or nft rule; its programs
//! attached to a cgroup of this test's own; Services written through the plugin's writer
//! (`ebpf-cni service-set`); clients (python3) started in that cgroup and in a pod's namespace.
//! Checks: TCP, connected and unconnected UDP to a ClusterIP reaching a backend on this node and
//! on the other (IPv4 and IPv6), the application seeing the ClusterIP as its peer, the flows on
//! the fast paths, a Service without endpoint refused at once, ClientIP affinity, a connected
//! UDP socket moved to a live backend within 1 s of its backend's removal, an open TCP
//! connection to a removed backend ended at once, and nothing left after the last DEL.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    lan::{Ipv6Plan, Lan, at},
    run, run_in,
    service_probe::{Client, TCP_PORT, Tagged, UDP_PORT},
};
use ebpf_common::{DropReason, ForwardPath};
use serde_json::{Value, json};

#[test]
fn services_are_translated_at_connect_time() {
    let test = "services_are_translated_at_connect_time";
    let plan = Ipv6Plan { cluster_cidr: "fd00:10:98::/56", subnets: ["fd00:10:98:1::/64", "fd00:10:98:2::/64"] };
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "slb", "10.198.0.0/16", ["10.198.1.0/24", "10.198.2.0/24"], plan)
    else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    // Node 1's node file: its primary network, Services by the socket LB in the test's cgroup.
    let cluster = format!("10.198.0.0/16,{}", plan.cluster_cidr);
    lan.use_kube_proxy_replacement(0, &cgroup, &cluster, Some(plan.subnets[0]));
    let (client, a) = (lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap());
    let b = lan.add_pod(1).unwrap();
    let (_a_servers, _b_servers) = (Tagged::start(&a.netns, "A"), Tagged::start(&b.netns, "B"));

    // No kube-proxy: not one rule in node 1's netfilter.
    let ruleset = run_in(&lan.nodes[0].node.name, "nft", &["list", "ruleset"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&ruleset.stdout).trim(), "", "node 1 has nft rules");
    let saved = run_in(&lan.nodes[0].node.name, "iptables-save", &[]).unwrap();
    assert!(!String::from_utf8_lossy(&saved.stdout).contains("\n-A "), "node 1 has iptables rules");
    // The programs are attached to the test's cgroup (and pinned), nowhere else.
    let links = lan.nodes[0].version_dir().join("links");
    assert_eq!(std::fs::read_dir(&links).unwrap().count(), ebpf_common::names::SOCKET_LB.len());
    let attached = run("bpftool", &["-j", "cgroup", "show", cgroup.path().to_str().unwrap()]).unwrap();
    let attached: Value = serde_json::from_slice(&attached.stdout).unwrap();
    assert_eq!(attached.as_array().map(Vec::len), Some(8), "{attached}");

    let (a6, b6) = (a.ip6.unwrap(), b.ip6.unwrap());
    let set = |f: &str, p: &str, backends: &[String]| lan.service_set(0, f, p, backends, &[]);
    set("10.96.0.10:80", "tcp", &[at(a.ip, TCP_PORT)]);
    set("10.96.0.10:53", "udp", &[at(a.ip, UDP_PORT)]);
    set("10.96.0.20:80", "tcp", &[at(b.ip, TCP_PORT)]);
    set("10.96.0.20:53", "udp", &[at(b.ip, UDP_PORT)]);
    set("[fd00:96::10]:80", "tcp", &[at(b6, TCP_PORT)]);
    set("[fd00:96::10]:53", "udp", &[at(a6, UDP_PORT)]);
    set("10.96.0.30:80", "tcp", &[]);
    set("10.96.0.30:53", "udp", &[]);
    let both = [at(a.ip, TCP_PORT), at(b.ip, TCP_PORT)];
    lan.service_set(0, "10.96.0.40:80", "tcp", &both, &["--affinity-seconds", "60"]);

    let node1 = &lan.nodes[0];
    let (local_before, remote_before, stack_before) = (
        node1.forwarded(ForwardPath::PodToPod).unwrap(),
        node1.forwarded(ForwardPath::ToOtherNode).unwrap(),
        node1.forwarded(ForwardPath::StackFlow).unwrap(),
    );
    // A backend on this node, then on the other; the application sees the ClusterIP.
    let local = Client::once(&cgroup, &client, &["tcp", "10.96.0.10", "80"]);
    assert_eq!(local, json!({"peer": "10.96.0.10:80", "reply": "A"}));
    let local_after = node1.forwarded(ForwardPath::PodToPod).unwrap();
    assert!(local_after > local_before, "not pod-to-pod: {local_before} → {local_after}");
    let remote = Client::once(&cgroup, &client, &["tcp", "10.96.0.20", "80"]);
    assert_eq!(remote, json!({"peer": "10.96.0.20:80", "reply": "B"}));
    let remote_after = node1.forwarded(ForwardPath::ToOtherNode).unwrap();
    assert!(remote_after > remote_before, "not to-other-node: {remote_before} → {remote_after}");
    let connected = Client::once(&cgroup, &client, &["udp", "10.96.0.10", "53", "1", "0"]);
    assert_eq!(connected, json!({"peer": "10.96.0.10:53", "reply": "A"}));
    let unconnected = Client::once(&cgroup, &client, &["udp-unconnected", "10.96.0.20", "53"]);
    assert_eq!(unconnected, json!({"source": "10.96.0.20:53", "reply": "B"}));
    let v6 = Client::once(&cgroup, &client, &["tcp", "fd00:96::10", "80"]);
    assert_eq!(v6, json!({"peer": "[fd00:96::10]:80", "reply": "B"}));
    let v6 = Client::once(&cgroup, &client, &["udp", "fd00:96::10", "53", "1", "0"]);
    assert_eq!(v6, json!({"peer": "[fd00:96::10]:53", "reply": "A"}));
    let v6 = Client::once(&cgroup, &client, &["udp-unconnected", "fd00:96::10", "53"]);
    assert_eq!(v6, json!({"source": "[fd00:96::10]:53", "reply": "A"}));
    assert_eq!(node1.forwarded(ForwardPath::StackFlow).unwrap(), stack_before, "a Service flow took the stack");

    // No endpoint: refused at once, counted.
    let refused_before = node1.drops(DropReason::ServiceNoEndpoint).unwrap();
    for args in [["tcp", "10.96.0.30", "80"], ["udp-unconnected", "10.96.0.30", "53"]] {
        let refused = Client::once(&cgroup, &client, &args);
        assert_eq!(refused["error"], json!(libc::ECONNREFUSED), "{args:?}: {refused}");
        assert!(refused["ms"].as_f64().unwrap() < 100.0, "{args:?}: not at once: {refused}");
    }
    assert_eq!(node1.drops(DropReason::ServiceNoEndpoint).unwrap(), refused_before + 2);

    // ClientIP affinity: one backend for every connection of the client.
    let replies: Vec<Value> =
        (0..8).map(|_| Client::once(&cgroup, &client, &["tcp", "10.96.0.40", "80"])["reply"].clone()).collect();
    assert!(replies.iter().all(|r| *r == replies[0]), "affinity broken: {replies:?}");

    // A connected UDP socket whose backend is removed reaches the new one within 1 s, on the
    // same socket: the application never reconnects.
    set("10.96.0.50:53", "udp", &[at(a.ip, UDP_PORT)]);
    let resolver = Client::start(&cgroup, &client, &["udp", "10.96.0.50", "53", "200", "0.02"]);
    assert_eq!(resolver.next(Duration::from_secs(3)), json!({"peer": "10.96.0.50:53", "reply": "A"}));
    let settled = set("10.96.0.50:53", "udp", &[at(b.ip, UDP_PORT)]);
    let replaced = Instant::now();
    assert_eq!(settled["reconnected"], json!(1), "{settled}");
    loop {
        let line = resolver.next(Duration::from_secs(1));
        if line["reply"] == json!("B") {
            assert_eq!(line["peer"], json!("10.96.0.50:53"));
            break;
        }
        assert!(replaced.elapsed() < Duration::from_secs(1), "still not on the new backend: {line}");
    }
    println!("connected UDP on the new backend {:?} after the change", replaced.elapsed());
    drop(resolver);

    // An open TCP connection to a removed backend ends at once.
    set("10.96.0.60:80", "tcp", &[at(b.ip, TCP_PORT)]);
    let held = Client::start(&cgroup, &client, &["tcp-hold", "10.96.0.60", "80"]);
    assert_eq!(held.next(Duration::from_secs(3)), json!({"peer": "10.96.0.60:80", "reply": "B"}));
    let settled = set("10.96.0.60:80", "tcp", &[at(a.ip, TCP_PORT)]);
    let removed = Instant::now();
    assert_eq!(settled["destroyed"], json!(1), "{settled}");
    let ended = held.next(Duration::from_secs(1));
    assert_eq!(ended["ended"], json!(libc::ECONNABORTED), "{ended}");
    println!("TCP connection ended {:?} after its backend's removal", removed.elapsed());
    drop(held);

    // inspect services shows them; removal leaves its frontend's slots.
    let out = Command::new(&lan.nodes[0].plugin.binary)
        .args(["inspect", "services", "-o", "json", "--network", &lan.nodes[0].network, "--bpffs-root"])
        .arg(lan.nodes[0].bpffs_root())
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 11, "{listed}");
    let gone = lan.service_set(0, "10.96.0.60:80", "tcp", &[], &["--remove"]);
    assert_eq!(gone["destroyed"], json!(0));
    assert_eq!(lan.nodes[0].map_len("SVC_FRONTENDS").unwrap(), 10);

    // The last DEL unpins the links: the cgroup has no program left, and nothing is left.
    for pod in 0..2 {
        lan.del_pod(0, pod).unwrap();
    }
    lan.del_pod(1, 0).unwrap();
    let attached = run("bpftool", &["-j", "cgroup", "show", cgroup.path().to_str().unwrap()]).unwrap();
    let attached: Value = serde_json::from_slice(&attached.stdout).unwrap_or(json!([]));
    assert_eq!(attached.as_array().map_or(0, Vec::len), 0, "{attached}");
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
    let cgroup_path = cgroup.path().to_path_buf();
    drop(cgroup);
    assert!(!cgroup_path.exists(), "the test's cgroup is left");
}
