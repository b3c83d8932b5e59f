//! `ipMasq`: pods reach a server outside the cluster behind the node's address, with every
//! translation in BPF (no bridge, no iptables or nft rule), and a pod's flows end with it.
use std::net::{Ipv4Addr, SocketAddrV4};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER, NODE1_UPLINK_IP, run_in,
    runtime::Runtime,
    traffic::{self, ask_tcp, next_echo_request_source, recv_udp, serve_tcp},
};
use ebpf_common::{DropReason, ForwardPath};
use serde_json::{Value, json};

const CLUSTER: &str = "10.248.0.0/16";

fn server(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(EXT_SERVER.parse().unwrap(), port)
}

fn node_ip() -> Ipv4Addr {
    NODE1_UPLINK_IP.parse().unwrap()
}

/// Node 1 (masquerading, pods in `node1_subnet`), node 2 and the external server.
fn cluster(test: &str, tag: &str, node1_subnet: &str) -> Option<Cluster> {
    Cluster::for_test(test, tag, CLUSTER, [node1_subnet, "10.248.2.0/24"])
}

/// `formatted` entries of a BTF-typed map dump.
fn entries(dump: &Value) -> Vec<Value> {
    dump.as_array().unwrap().iter().map(|e| e["formatted"].clone()).collect()
}

#[test]
fn tcp_udp_and_ping_leave_with_the_node_address() {
    let Some(mut c) = cluster("tcp_udp_and_ping_leave_with_the_node_address", "mq", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    let pod_ns = node.pods[pod].netns.name.clone();

    let listener = traffic::tcp_listener(&c.ext.name, server(8080)).unwrap();
    let served = serve_tcp(listener, 1);
    let mut stream = traffic::tcp_connect(&pod_ns, 0, server(8080)).unwrap();
    let seen = ask_tcp(&mut stream).unwrap();
    assert!(seen.starts_with(&format!("{NODE1_UPLINK_IP}:")), "TCP: the server saw {seen}");
    assert_eq!(served.join().unwrap().unwrap().len(), 1);

    let udp_server = traffic::udp_socket(&c.ext.name, server(5353)).unwrap();
    let client = traffic::udp_socket(&pod_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    client.send_to(b"ping", server(5353)).unwrap();
    let (from, _) = recv_udp(&udp_server).unwrap();
    assert_eq!(from.ip(), node_ip(), "UDP: the server saw {from}");
    udp_server.send_to(b"pong", from).unwrap();
    let (reply_from, body) = recv_udp(&client).unwrap();
    assert_eq!((reply_from, body.as_slice()), (server(5353).into(), b"pong".as_slice()), "UDP reply");

    let icmp = traffic::icmp_listener(&c.ext.name).unwrap();
    assert!(node.ping(&pod_ns, EXT_SERVER), "ping through masquerade");
    assert_eq!(next_echo_request_source(&icmp).unwrap(), node_ip(), "ICMP: the server saw another source");

    // Each request left masqueraded and each reply went straight back into the pod: counted.
    assert!(node.forwarded(ForwardPath::Masqueraded).unwrap() >= 3, "masqueraded packets");
    assert!(node.forwarded(ForwardPath::ReplyToPod).unwrap() >= 3, "replies into the pod");

    // The flows, both directions each, with field names.
    let nat = entries(&node.map_dump("NAT").unwrap());
    for protocol in [6, 17, 1] {
        let flows: Vec<&Value> = nat.iter().filter(|e| e["key"]["protocol"] == protocol).collect();
        assert_eq!(flows.len(), 2, "protocol {protocol}: {nat:?}");
        assert!(flows.iter().any(|e| e["value"]["direction"] == 1 && e["value"]["port"].as_u64().is_some()));
    }

    // No rule, no bridge: the node's netfilter tables are empty.
    let iptables = run_in(&node.node.name, "iptables-save", &[]).unwrap();
    let rules: Vec<String> = String::from_utf8_lossy(&iptables.stdout)
        .lines()
        .filter(|l| l.starts_with("-A") || l.starts_with("-N"))
        .map(str::to_string)
        .collect();
    assert_eq!(rules, Vec::<String>::new(), "iptables rules in the node");
    let nft = run_in(&node.node.name, "nft", &["list", "ruleset"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&nft.stdout).trim(), "", "nft ruleset in the node");
    let bridges = run_in(&node.node.name, "ip", &["-o", "link", "show", "type", "bridge"]).unwrap();
    assert!(bridges.stdout.is_empty(), "a bridge exists in the node");

    // The uplink's programs are cls_bpf filters under a clsact qdisc the first ADD added.
    let uplink_qdiscs = || {
        let out = run_in(&node.node.name, "tc", &["qdisc", "show", "dev", "uplink0"]).unwrap();
        String::from_utf8_lossy(&out.stdout).contains("clsact")
    };
    assert!(uplink_qdiscs(), "a clsact qdisc on the uplink");
    node.del(pod).unwrap();
    assert_eq!(entries(&node.map_dump_if_pinned("NAT").unwrap()), Vec::<Value>::new(), "NAT entries after DEL");
    assert_eq!(node.leftovers().unwrap(), Vec::<String>::new());
    assert!(!uplink_qdiscs(), "the last DEL removes the uplink's filters and their qdisc");
}

#[test]
fn two_pods_share_a_source_port_to_the_same_server() {
    let Some(mut c) = cluster("two_pods_share_a_source_port_to_the_same_server", "mqp", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let pods: Vec<usize> = (0..2).map(|_| node.new_pod().unwrap()).collect();
    for &pod in &pods {
        node.add(pod).unwrap();
    }
    let listener = traffic::tcp_listener(&c.ext.name, server(8080)).unwrap();
    let served = serve_tcp(listener, 2);
    // Both connections open at once, from the same source port, to the same server port.
    let mut streams: Vec<_> = pods
        .iter()
        .map(|&pod| traffic::tcp_connect(&node.pods[pod].netns.name, 40_000, server(8080)).unwrap())
        .collect();
    let seen: Vec<String> = streams.iter_mut().map(|s| ask_tcp(s).unwrap()).collect();
    let peers = served.join().unwrap().unwrap();
    assert!(peers.iter().all(|p| p.ip() == node_ip()), "{peers:?}");
    assert_ne!(peers[0].port(), peers[1].port(), "two flows got one port: {peers:?}");
    // Never the pod's own port: only masqPortRange is kept clear of the node's own sockets.
    assert!(peers.iter().all(|p| (1_024..=29_999).contains(&p.port())), "ports outside the default range: {peers:?}");
    assert_eq!(seen.len(), 2);
}

#[test]
fn no_free_port_drops_and_counts() {
    let Some(mut c) = cluster("no_free_port_drops_and_counts", "mqx", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    node.extra.insert("masqPortRange".into(), json!("40000-40001"));
    let pods: Vec<usize> = (0..3).map(|_| node.new_pod().unwrap()).collect();
    for &pod in &pods {
        node.add(pod).unwrap();
    }
    let udp_server = traffic::udp_socket(&c.ext.name, server(5353)).unwrap();
    let mut sources = Vec::new();
    for &pod in &pods[..2] {
        let client =
            traffic::udp_socket(&node.pods[pod].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 40_000)).unwrap();
        client.send_to(b"x", server(5353)).unwrap();
        sources.push(recv_udp(&udp_server).unwrap().0.port());
    }
    sources.sort();
    assert_eq!(sources, [40_000, 40_001]);
    let before = node.drops(DropReason::NatPortsExhausted).unwrap();
    let third =
        traffic::udp_socket(&node.pods[pods[2]].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 40_000)).unwrap();
    third.send_to(b"x", server(5353)).unwrap();
    assert!(recv_udp(&udp_server).is_err(), "a third flow got through with no port left");
    assert_eq!(node.drops(DropReason::NatPortsExhausted).unwrap(), before + 1);
}

#[test]
fn replies_after_delete_reach_no_pod() {
    // A /30 has one pod address, so the next pod gets the deleted pod's address.
    let Some(mut c) = cluster("replies_after_delete_reach_no_pod", "mqd", "10.248.1.0/30") else {
        return;
    };
    let node = &mut c.nodes[0];
    let (first, second) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let address = node.add(first).unwrap();
    let udp_server = traffic::udp_socket(&c.ext.name, server(5353)).unwrap();
    let port = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 41_000);
    let client = traffic::udp_socket(&node.pods[first].netns.name, port).unwrap();
    client.send_to(b"x", server(5353)).unwrap();
    let (masqueraded, _) = recv_udp(&udp_server).unwrap();
    assert!(!entries(&node.map_dump("NAT").unwrap()).is_empty());

    node.del(first).unwrap();
    assert_eq!(node.add(second).unwrap(), address, "the address was not reused");
    let nat = entries(&node.map_dump("NAT").unwrap());
    assert_eq!(nat, Vec::<Value>::new(), "the deleted pod's flows are still translated");
    // Same address, same port, listening: a late reply to the old flow must not arrive here.
    let successor = traffic::udp_socket(&node.pods[second].netns.name, port).unwrap();
    udp_server.send_to(b"late", masqueraded).unwrap();
    assert!(recv_udp(&successor).is_err(), "a reply to a deleted pod's flow reached the next pod");
}

#[test]
fn other_settings_are_refused_while_the_network_has_pods() {
    let Some(mut c) = cluster("other_settings_are_refused_while_the_network_has_pods", "mqs", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let (first, second) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let first_ip = node.add(first).unwrap();
    let mut changed = node.conf("1.1.0");
    changed["masqPortRange"] = json!("50000-50100");
    let out = node.cni("ADD", second, &changed).unwrap();
    assert_eq!(out.code(), Some(7), "{}", out.stdout);
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("1024-29999"), "the error should say what is loaded: {msg}");
    assert!(node.ping(&node.pods[first].netns.name, EXT_SERVER), "the first pod lost the outside");
    assert!(node.ping(&node.node.name, &first_ip));
    assert_eq!(node.ip_files().len(), 1, "the refused ADD kept its address");

    // Once the network is empty, the next ADD loads the new settings.
    node.del(first).unwrap();
    let out = node.cni("ADD", second, &changed).unwrap();
    assert!(out.success, "{}", out.stdout);
    let settings = entries(&node.map_dump("SETTINGS").unwrap());
    assert_eq!(settings[0]["value"]["port_min"], 50_000, "{settings:?}");
}

#[test]
fn gc_forgets_the_flows_of_pods_that_vanished() {
    let Some(mut c) = cluster("gc_forgets_the_flows_of_pods_that_vanished", "mqgc", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let (gone, kept) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let addresses: Vec<String> = [gone, kept].iter().map(|&p| node.add(p).unwrap()).collect();
    let udp_server = traffic::udp_socket(&c.ext.name, server(5353)).unwrap();
    for &pod in &[gone, kept] {
        let client =
            traffic::udp_socket(&node.pods[pod].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        client.send_to(b"x", server(5353)).unwrap();
        recv_udp(&udp_server).unwrap();
    }
    assert_eq!(entries(&node.map_dump("NAT").unwrap()).len(), 4);
    // The sandbox vanishes without a DEL (a node crash, a runtime bug); GC names the other pod.
    ebpf_cni_tests::run("ip", &["netns", "del", &node.pods[gone].netns.name]).unwrap();
    let rt = Runtime::for_testbed(node);
    let list = rt.load(&node.conflist("1.1.0", vec![])).unwrap();
    rt.gc(&list, &[&node.sandbox(kept)]).unwrap();
    let nat = entries(&node.map_dump("NAT").unwrap());
    assert_eq!(nat.len(), 2, "{nat:?}");
    // The egress entry of the remaining flow is keyed by the kept pod's address.
    let kept_octets: Vec<u64> = addresses[1].split('.').map(|o| o.parse().unwrap()).collect();
    let egress = nat.iter().find(|e| e["value"]["direction"] == 1).expect("egress entry");
    let src: Vec<u64> =
        egress["key"]["src_addr"].as_array().unwrap()[..4].iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(src, kept_octets, "{egress}");
    assert_eq!(node.map_len("ENDPOINTS").unwrap(), 1);
    assert_eq!(node.host_veths().unwrap().len(), 1);
    assert!(node.ping(&node.pods[kept].netns.name, EXT_SERVER), "the kept pod lost the outside");
}

/// A first ADD killed after it attached the uplink's filters but before its load was complete:
/// the next ADD loads again and replaces those filters rather than adding a second pair, and
/// the last DEL leaves the uplink as it found it.
#[test]
fn a_killed_first_load_leaves_no_second_uplink_filter() {
    let Some(mut c) = cluster("a_killed_first_load_leaves_no_second_uplink_filter", "mqk", "10.248.9.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let (killed, next) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    ebpf_cni_tests::crash::killed_at(node, killed, "ADD", "add:after-uplink");
    node.add(next).unwrap();
    let filters = |direction: &str| {
        let out = run_in(&node.node.name, "tc", &["filter", "show", "dev", "uplink0", direction]).unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("direct-action")).count()
    };
    assert_eq!((filters("egress"), filters("ingress")), (1, 1), "one filter each way");
    node.del(killed).unwrap();
    node.del(next).unwrap();
    assert_eq!((filters("egress"), filters("ingress")), (0, 0));
    assert_eq!(node.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn datagrams_larger_than_the_mtu_cross_in_fragments() {
    let Some(mut c) = cluster("datagrams_larger_than_the_mtu_cross_in_fragments", "mqf", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    let pod_ns = node.pods[pod].netns.name.clone();
    // 4000 bytes of ICMP echo: three fragments out (pod MTU 1450), three back.
    let ping = run_in(&pod_ns, "ping", &["-c", "1", "-W", "2", "-s", "4000", EXT_SERVER]);
    assert!(ping.is_ok(), "a 4000-byte ping through masquerade: {ping:?}");
    // And a UDP datagram of 6000 bytes each way, from a connected socket.
    let udp_server = traffic::udp_socket(&c.ext.name, server(5354)).unwrap();
    let client = traffic::udp_socket(&pod_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    client.connect(server(5354)).unwrap();
    client.send(&[7; 6000]).unwrap();
    let (from, body) = recv_udp(&udp_server).unwrap();
    assert_eq!((from.ip(), body.len()), (node_ip().into(), 6000), "the datagram arrived whole, masqueraded");
    udp_server.send_to(&[9; 6000], from).unwrap();
    let (_, reply) = recv_udp(&client).unwrap();
    assert_eq!(reply.len(), 6000, "the reply arrived whole");
    assert_eq!(node.drops(DropReason::NatUntranslatable).unwrap(), 0);
}

#[test]
fn ports_a_node_socket_holds_are_never_handed_out() {
    let Some(mut c) = cluster("ports_a_node_socket_holds_are_never_handed_out", "mqn", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    node.extra.insert("masqPortRange".into(), json!("40000-40001"));
    let pods: Vec<usize> = (0..2).map(|_| node.new_pod().unwrap()).collect();
    for &pod in &pods {
        node.add(pod).unwrap();
    }
    // A node service bound into the range (as a hostNetwork pod might be).
    let node_socket = traffic::udp_socket(&node.node.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 40_000)).unwrap();
    let udp_server = traffic::udp_socket(&c.ext.name, server(5353)).unwrap();
    let send_from = |pod: usize| {
        let client = traffic::udp_socket(&node.pods[pod].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        client.unwrap().send_to(b"x", server(5353)).unwrap();
    };
    send_from(pods[0]);
    let (from, _) = recv_udp(&udp_server).unwrap();
    assert_eq!(from.port(), 40_001, "the port the node's socket holds was handed out");
    // The only other port is the node's: the second pod's flow has none.
    let before = node.drops(DropReason::NatPortsExhausted).unwrap();
    send_from(pods[1]);
    assert!(recv_udp(&udp_server).is_err(), "a flow got a port the node's socket holds");
    assert_eq!(node.drops(DropReason::NatPortsExhausted).unwrap(), before + 1);
    // A reply to the node's port is the node's.
    udp_server.send_to(b"for the node", SocketAddrV4::new(node_ip(), 40_000)).unwrap();
    let (_, body) = recv_udp(&node_socket).unwrap();
    assert_eq!(body, b"for the node");
}

#[test]
fn one_pod_cannot_open_flows_without_end() {
    let Some(mut c) = cluster("one_pod_cannot_open_flows_without_end", "mql", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    node.extra.insert("masqPodFlowsPerMinute".into(), json!(2));
    let pods: Vec<usize> = (0..2).map(|_| node.new_pod().unwrap()).collect();
    for &pod in &pods {
        node.add(pod).unwrap();
    }
    let servers: Vec<_> = (5353..5356).map(|port| traffic::udp_socket(&c.ext.name, server(port)).unwrap()).collect();
    let clients: Vec<_> = pods
        .iter()
        .map(|&pod| traffic::udp_socket(&node.pods[pod].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)))
        .collect::<Result<_, _>>()
        .unwrap();
    let reaches = |client: usize, to: usize| {
        clients[client].send_to(b"x", server(5353 + to as u16)).unwrap();
        recv_udp(&servers[to]).is_ok()
    };
    assert!(reaches(0, 0) && reaches(0, 1), "the first two flows of a pod in a minute");
    let before = node.drops(DropReason::NatPodLimit).unwrap();
    assert!(!reaches(0, 2), "a third new flow within the minute, over masqPodFlowsPerMinute 2");
    assert_eq!(node.drops(DropReason::NatPodLimit).unwrap(), before + 1);
    assert!(reaches(0, 0), "a flow the pod already has goes on");
    assert!(reaches(1, 2), "another pod is not held back");
}

#[test]
fn a_closed_connection_gives_its_port_back_within_seconds() {
    let Some(mut c) = cluster("a_closed_connection_gives_its_port_back_within_seconds", "mqc", "10.248.1.0/24") else {
        return;
    };
    let node = &mut c.nodes[0];
    // One port: the second connection to the same server needs the first one's.
    node.extra.insert("masqPortRange".into(), json!("40000-40000"));
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    let pod_ns = node.pods[pod].netns.name.clone();
    let listener = traffic::tcp_listener(&c.ext.name, server(8080)).unwrap();
    let served = serve_tcp(listener, 2);
    let mut first = traffic::tcp_connect(&pod_ns, 0, server(8080)).unwrap();
    ask_tcp(&mut first).unwrap();
    drop(first);
    // FIN and RST make a flow's port free after 10 s (NAT_TIMEOUT_TCP_CLOSING_NS), not 2 h.
    std::thread::sleep(std::time::Duration::from_millis(10_500));
    let mut second = traffic::tcp_connect(&pod_ns, 0, server(8080)).unwrap();
    let seen = ask_tcp(&mut second).unwrap();
    assert_eq!(seen, format!("{NODE1_UPLINK_IP}:40000"), "the second connection");
    served.join().unwrap().unwrap();
}
