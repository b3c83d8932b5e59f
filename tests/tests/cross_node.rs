//! Pods on two nodes reach each other by their own addresses through per-node routes (no NAT
//! inside the cluster, no overlay), and each node reaches the other node's pods.
use std::net::SocketAddrV4;

use ebpf_cni_tests::{
    Cluster, UNDERLAY_IPS,
    traffic::{self, ask_tcp, serve_tcp},
};
use ebpf_common::ForwardPath;

#[test]
fn pods_and_nodes_reach_across_nodes_without_nat() {
    let Some(mut c) = Cluster::for_test(
        "pods_and_nodes_reach_across_nodes_without_nat",
        "xn",
        "10.247.0.0/16",
        ["10.247.1.0/24", "10.247.2.0/24"],
    ) else {
        return;
    };
    let mut ips = Vec::new();
    for node in &mut c.nodes {
        let pod = node.new_pod().unwrap();
        ips.push(node.add(pod).unwrap());
    }
    let pod_ns: Vec<String> = c.nodes.iter().map(|n| n.pods[0].netns.name.clone()).collect();
    for (from, to) in [(0, 1), (1, 0)] {
        // These nodes reach each other through an underlay that is not their uplink: replies
        // would come back where no program of ours waits, into conntrack, so both ways take the
        // kernel's forwarding path (the single-NIC nodes of `services.rs` take the fast one).
        let forwarded = c.nodes[from].kernel_forwarded().unwrap();
        let to_stack = c.nodes[from].forwarded(ForwardPath::ToStack).unwrap();
        assert!(c.nodes[0].ping(&pod_ns[from], &ips[to]), "pod on node {} → pod on node {}", from + 1, to + 1);
        assert_eq!(c.nodes[from].kernel_forwarded().unwrap() - forwarded, 2, "request and reply: the kernel's path");
        assert_eq!(c.nodes[from].forwarded(ForwardPath::ToStack).unwrap() - to_stack, 1, "counted as to-stack");
        let node_ns = &c.nodes[from].node.name;
        assert!(c.nodes[0].ping(node_ns, &ips[to]), "node {} → pod on node {}", from + 1, to + 1);
        assert!(c.nodes[0].ping(&pod_ns[to], UNDERLAY_IPS[from]), "pod on node {} → node {}", to + 1, from + 1);

        // The server pod sees the client pod's own address: no masquerade inside the cluster,
        // although node 1 masquerades what leaves the cluster.
        let at = SocketAddrV4::new(ips[to].parse().unwrap(), 9000);
        let served = serve_tcp(traffic::tcp_listener(&pod_ns[to], at).unwrap(), 1);
        let seen = ask_tcp(&mut traffic::tcp_connect(&pod_ns[from], 0, at).unwrap()).unwrap();
        assert!(seen.starts_with(&format!("{}:", ips[from])), "pod {} was seen as {seen}", ips[from]);
        served.join().unwrap().unwrap();
    }
    let nat = c.nodes[0].map_dump("NAT").unwrap();
    assert_eq!(nat.as_array().map(Vec::len), Some(0), "cluster traffic was masqueraded: {nat}");
    for node in &c.nodes {
        node.del(0).unwrap();
        assert_eq!(node.leftovers().unwrap(), Vec::<String>::new());
    }
}
