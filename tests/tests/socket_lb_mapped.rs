//! The socket LB for dual-stack applications (Java and many runtimes): an `AF_INET6` socket with
//! `IPV6_V6ONLY` off dialling an IPv4 ClusterIP as `::ffff:<ClusterIP>` is translated as an
//! `AF_INET` socket would be, and sees the mapped ClusterIP as its peer. Node 1 of an IPv4 LAN
//! with `kubeProxyReplacement`, the programs on a cgroup of this test's own, Services written by
//! `ebpf-cni service-set`, python3 clients in that cgroup and a pod's namespace. Checks what
//! `socket_lb.rs` checks for IPv4: TCP, connected and unconnected UDP reaching a backend, the
//! refusal of a Service without endpoint, a connected UDP socket moved to a live backend within
//! 1 s of its backend's removal, and an open TCP connection to a removed backend ended at once.
use std::time::{Duration, Instant};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    lan::{Lan, at},
    service_probe::{Client, TCP_PORT, Tagged, UDP_PORT},
};
use ebpf_common::{DropReason, ForwardPath};
use serde_json::json;

#[test]
fn v4_mapped_sockets_are_translated_at_connect_time() {
    let test = "v4_mapped_sockets_are_translated_at_connect_time";
    let Some(mut lan) = Lan::for_test(test, "slbm", "10.189.0.0/16", ["10.189.1.0/24", "10.189.2.0/24"]) else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb-mapped", lan.nodes[0].run_id)).unwrap();
    lan.use_kube_proxy_replacement(0, &cgroup, "10.189.0.0/16", None);
    let (client, a) = (lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap());
    let b = lan.add_pod(1).unwrap();
    let (_a_servers, _b_servers) = (Tagged::start(&a.netns, "A"), Tagged::start(&b.netns, "B"));
    let set = |f: &str, p: &str, backends: &[String]| lan.service_set(0, f, p, backends, &[]);
    set("10.96.0.10:80", "tcp", &[at(a.ip, TCP_PORT)]);
    set("10.96.0.10:53", "udp", &[at(a.ip, UDP_PORT)]);
    set("10.96.0.20:53", "udp", &[at(b.ip, UDP_PORT)]);
    set("10.96.0.30:80", "tcp", &[]);
    set("10.96.0.30:53", "udp", &[]);

    // The IPv4 Service, a backend's IPv4 address on the wire (the pod-to-pod fast path), and
    // the mapped ClusterIP where the application reads its peer.
    let node1 = &lan.nodes[0];
    let local_before = node1.forwarded(ForwardPath::PodToPod).unwrap();
    let tcp = Client::once(&cgroup, &client, &["tcp", "::ffff:10.96.0.10", "80"]);
    assert_eq!(tcp, json!({"peer": "[::ffff:10.96.0.10]:80", "reply": "A"}));
    let local_after = node1.forwarded(ForwardPath::PodToPod).unwrap();
    assert!(local_after > local_before, "not pod-to-pod: {local_before} → {local_after}");
    let connected = Client::once(&cgroup, &client, &["udp", "::ffff:10.96.0.10", "53", "1", "0"]);
    assert_eq!(connected, json!({"peer": "[::ffff:10.96.0.10]:53", "reply": "A"}));
    let unconnected = Client::once(&cgroup, &client, &["udp-unconnected", "::ffff:10.96.0.20", "53"]);
    assert_eq!(unconnected, json!({"source": "[::ffff:10.96.0.20]:53", "reply": "B"}));

    // No endpoint: refused at once, counted, as for an AF_INET socket.
    let refused_before = node1.drops(DropReason::ServiceNoEndpoint).unwrap();
    for args in [["tcp", "::ffff:10.96.0.30", "80"], ["udp-unconnected", "::ffff:10.96.0.30", "53"]] {
        let refused = Client::once(&cgroup, &client, &args);
        assert_eq!(refused["error"], json!(libc::ECONNREFUSED), "{args:?}: {refused}");
        assert!(refused["ms"].as_f64().unwrap() < 100.0, "{args:?}: not at once: {refused}");
    }
    assert_eq!(node1.drops(DropReason::ServiceNoEndpoint).unwrap(), refused_before + 2);

    // A connected UDP socket whose backend is removed reaches the new one within 1 s, on the
    // same socket, still showing the mapped ClusterIP: settling finds AF_INET6 sockets too.
    set("10.96.0.50:53", "udp", &[at(a.ip, UDP_PORT)]);
    let resolver = Client::start(&cgroup, &client, &["udp", "::ffff:10.96.0.50", "53", "200", "0.02"]);
    assert_eq!(resolver.next(Duration::from_secs(3)), json!({"peer": "[::ffff:10.96.0.50]:53", "reply": "A"}));
    let settled = set("10.96.0.50:53", "udp", &[at(b.ip, UDP_PORT)]);
    let replaced = Instant::now();
    assert_eq!(settled["reconnected"], json!(1), "{settled}");
    loop {
        let line = resolver.next(Duration::from_secs(1));
        if line["reply"] == json!("B") {
            assert_eq!(line["peer"], json!("[::ffff:10.96.0.50]:53"));
            break;
        }
        assert!(replaced.elapsed() < Duration::from_secs(1), "still not on the new backend: {line}");
    }
    println!("mapped connected UDP on the new backend {:?} after the change", replaced.elapsed());
    drop(resolver);

    // An open TCP connection to a removed backend ends at once.
    set("10.96.0.60:80", "tcp", &[at(b.ip, TCP_PORT)]);
    let held = Client::start(&cgroup, &client, &["tcp-hold", "::ffff:10.96.0.60", "80"]);
    assert_eq!(held.next(Duration::from_secs(3)), json!({"peer": "[::ffff:10.96.0.60]:80", "reply": "B"}));
    let settled = set("10.96.0.60:80", "tcp", &[at(a.ip, TCP_PORT)]);
    let removed = Instant::now();
    assert_eq!(settled["destroyed"], json!(1), "{settled}");
    let ended = held.next(Duration::from_secs(1));
    assert_eq!(ended["ended"], json!(libc::ECONNABORTED), "{ended}");
    println!("mapped TCP connection ended {:?} after its backend's removal", removed.elapsed());
    drop(held);

    for pod in 0..2 {
        lan.del_pod(0, pod).unwrap();
    }
    lan.del_pod(1, 0).unwrap();
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}
