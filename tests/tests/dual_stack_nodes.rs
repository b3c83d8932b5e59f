//! Dual-stack across two nodes (host-gw routes for both families over the underlay): pod ↔ pod
//! over IPv6 with the server seeing the client pod's own address, a node reaching the other
//! node's pod, IPv4 beside it unchanged, and IPv6 masquerade to the outside (TCP, UDP, ICMPv6
//! echo) with the server seeing node 1's IPv6 address.
use std::{
    io::{Read, Write},
    net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream, UdpSocket},
};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER_V6, NODE1_UPLINK_IPV6, run_in,
    traffic::{SOCKET_TIMEOUT, in_netns},
};
use ebpf_common::{DropReason, ForwardPath};

fn cluster(name: &str, tag: &str) -> Option<Cluster> {
    let mut c = Cluster::for_test(name, tag, "10.246.0.0/16", ["10.246.1.0/24", "10.246.2.0/24"])?;
    c.add_ipv6("fd00:10:246::/56", ["fd00:10:246:1::/64", "fd00:10:246:2::/64"]).unwrap();
    Some(c)
}

/// ADD on `node`; the new pod's netns and its addresses (IPv4, IPv6).
fn add_pod(c: &mut Cluster, node: usize) -> (String, String, String) {
    let tb = &mut c.nodes[node];
    let pod = tb.new_pod().unwrap();
    let out = tb.cni("ADD", pod, &tb.conf("1.0.0")).unwrap();
    assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
    let ips = out.json()["ips"].clone();
    let ip = |i: usize| ips[i]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    (tb.pods[pod].netns.name.clone(), ip(0), ip(1))
}

#[test]
fn pods_on_two_nodes_talk_over_ipv6_and_ipv4() {
    let Some(mut c) = cluster("pods_on_two_nodes_talk_over_ipv6_and_ipv4", "dsn") else { return };
    let (ns_a, v4_a, v6_a) = add_pod(&mut c, 0);
    let (ns_b, v4_b, v6_b) = add_pod(&mut c, 1);
    assert!(v6_a.starts_with("fd00:10:246:1::") && v6_b.starts_with("fd00:10:246:2::"), "{v6_a} {v6_b}");

    // TCP from the pod on node 1 to the pod on node 2: the server sees the client's address.
    let server_ip: Ipv6Addr = v6_b.parse().unwrap();
    let listener = in_netns(&ns_b, move || Ok(TcpListener::bind(SocketAddrV6::new(server_ip, 8080, 0, 0))?)).unwrap();
    let server = std::thread::spawn(move || -> anyhow::Result<SocketAddr> {
        let (mut stream, peer) = listener.accept()?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        let mut asked = [0u8; 4];
        stream.read_exact(&mut asked)?;
        stream.write_all(b"pong")?;
        Ok(peer)
    });
    let to = SocketAddr::V6(SocketAddrV6::new(server_ip, 8080, 0, 0));
    let answer = in_netns(&ns_a, move || {
        let mut stream = TcpStream::connect_timeout(&to, SOCKET_TIMEOUT)?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        stream.write_all(b"ping")?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    })
    .unwrap();
    assert_eq!(&answer, b"pong");
    assert_eq!(server.join().unwrap().unwrap().ip().to_string(), v6_a, "the server saw the client pod's address");

    let ping = |ns: &str, ip: &str, family: &str| run_in(ns, "ping", &[family, "-c", "1", "-W", "2", ip]).is_ok();
    assert!(ping(&ns_b, &v6_a, "-6"), "pod on node 2 → pod on node 1 over IPv6");
    assert!(ping(&c.nodes[1].node.name, &v6_a, "-6"), "node 2 → the pod on node 1 over IPv6");
    assert!(ping(&ns_a, &v4_b, "-4"), "pod on node 1 → pod on node 2 over IPv4");
    assert!(ping(&ns_b, &v4_a, "-4"), "pod on node 2 → pod on node 1 over IPv4");
    for node in &c.nodes {
        for reason in [DropReason::SpoofedSource, DropReason::UnsupportedProtocol, DropReason::SpoofedNeighbor] {
            assert_eq!(node.drops(reason).unwrap(), 0, "{} on {}", reason.name(), node.node.name);
        }
    }
}

/// A TCP exchange from `netns` to `server` (listening in `server_netns`); the source the server saw.
fn tcp_exchange(netns: &str, server_netns: &str, server: SocketAddrV6) -> SocketAddr {
    let listener = in_netns(server_netns, move || Ok(TcpListener::bind(server)?)).unwrap();
    let accepted = std::thread::spawn(move || -> anyhow::Result<SocketAddr> {
        let (mut stream, peer) = listener.accept()?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        let mut asked = [0u8; 4];
        stream.read_exact(&mut asked)?;
        stream.write_all(b"pong")?;
        Ok(peer)
    });
    let answer = in_netns(netns, move || {
        let mut stream = TcpStream::connect_timeout(&SocketAddr::V6(server), SOCKET_TIMEOUT)?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        stream.write_all(b"ping")?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    })
    .unwrap();
    assert_eq!(&answer, b"pong");
    accepted.join().unwrap().unwrap()
}

#[test]
fn ipv6_to_the_outside_leaves_with_the_node_address() {
    let Some(mut c) = cluster("ipv6_to_the_outside_leaves_with_the_node_address", "dsm") else { return };
    let (ns, _, v6) = add_pod(&mut c, 0);
    let ext = c.ext.name.clone();
    let server: Ipv6Addr = EXT_SERVER_V6.parse().unwrap();
    let before = c.nodes[0].forwarded(ForwardPath::Masqueraded).unwrap();

    let seen = tcp_exchange(&ns, &ext, SocketAddrV6::new(server, 8080, 0, 0));
    assert_eq!(seen.ip().to_string(), NODE1_UPLINK_IPV6, "TCP: the server saw the node's address");
    assert!((1024..30_000).contains(&seen.port()), "TCP: a port of masqPortRange, got {}", seen.port());

    let udp_server = in_netns(&ext, move || {
        let socket = UdpSocket::bind(SocketAddrV6::new(server, 5353, 0, 0))?;
        socket.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(socket)
    })
    .unwrap();
    let client = in_netns(&ns, || {
        let socket = UdpSocket::bind("[::]:0")?;
        socket.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(socket)
    })
    .unwrap();
    client.send_to(b"hello", SocketAddrV6::new(server, 5353, 0, 0)).unwrap();
    let mut buf = [0u8; 16];
    let (_, from) = udp_server.recv_from(&mut buf).unwrap();
    assert_eq!(from.ip().to_string(), NODE1_UPLINK_IPV6, "UDP: the server saw the node's address");
    udp_server.send_to(b"back", from).unwrap();
    let (n, replier) = client.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], replier.ip().to_string()), (&b"back"[..], EXT_SERVER_V6.to_string()), "UDP reply");

    let ping = run_in(&ns, "ping", &["-6", "-c", "2", "-W", "2", EXT_SERVER_V6]);
    assert!(ping.is_ok(), "ICMPv6 echo through masquerade: {ping:?}");
    let node = &c.nodes[0];
    assert!(node.forwarded(ForwardPath::Masqueraded).unwrap() >= before + 6, "counted as masqueraded");
    assert!(node.forwarded(ForwardPath::ReplyToPod).unwrap() >= 6, "replies translated back");
    let nat = node.map_dump("NAT").unwrap();
    let entries = nat.as_array().unwrap().len();
    assert!(entries >= 6, "TCP, UDP and echo flows, two entries each: {entries}");
    for reason in [DropReason::NatUntranslatable, DropReason::NatPortsExhausted, DropReason::SpoofedSource] {
        assert_eq!(node.drops(reason).unwrap(), 0, "{}", reason.name());
    }
    // DEL takes the pod's flows out of NAT (the pins stay for node 1's other attachments: none).
    let pod = 0;
    node.del(pod).unwrap();
    assert_eq!(node.leftovers().unwrap(), Vec::<String>::new());
    let _ = v6;
}
