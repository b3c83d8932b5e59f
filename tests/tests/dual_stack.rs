//! Dual-stack and IPv6-only pods on one node: both addresses in the result, IPv6 pod ↔ pod
//! straight into the other pod with the server seeing the client's own address, node ↔ pod,
//! the gateway resolved by the datapath's neighbour responder, forged IPv6 sources and
//! neighbour advertisements dropped, and nothing left after DEL.
use std::{
    io::{Read, Write},
    net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener, TcpStream, UdpSocket},
};

use ebpf_cni_tests::{
    Testbed, frames, run_in,
    traffic::{PacketSocket, SOCKET_TIMEOUT, in_netns},
};
use ebpf_common::{DropReason, ForwardPath};
use serde_json::{Value, json};

const V4_SUBNET: &str = "10.247.0.0/24";
const V6_SUBNET: &str = "fd00:10:247::/64";
const V6_GATEWAY: &str = "fd00:10:247::1";
/// The node's own IPv6 address (on its loopback, only inside the test's node namespace).
const NODE_IPV6: &str = "fd00:ff:247::1";

/// A testbed whose IPAM gives each pod one address per entry of `subnets`.
fn testbed(name: &str, tag: &str, subnets: &[&str]) -> Option<Testbed> {
    let mut tb = Testbed::for_test(name, tag, V4_SUBNET)?;
    let ranges: Vec<Value> = subnets.iter().map(|s| json!([{ "subnet": s }])).collect();
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    run_in(&tb.node.name, "ip", &["-6", "addr", "add", &format!("{NODE_IPV6}/128"), "dev", "lo"]).unwrap();
    Some(tb)
}

/// ADD (spec 1.1.0); the result's addresses, without prefixes, in its order.
fn add(tb: &Testbed, pod: usize) -> (Value, Vec<String>) {
    let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
    assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
    let result = out.json();
    let ips = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["address"].as_str().unwrap().split('/').next().unwrap().to_string())
        .collect();
    (result, ips)
}

fn ping6(netns: &str, ip: &str) -> bool {
    run_in(netns, "ping", &["-6", "-c", "1", "-W", "2", ip]).is_ok()
}

#[test]
fn dual_stack_pods_reach_each_other_over_both_families() {
    let Some(mut tb) = testbed("dual_stack_pods_reach_each_other_over_both_families", "ds", &[V4_SUBNET, V6_SUBNET])
    else {
        return;
    };
    let pods: Vec<usize> = (0..2).map(|_| tb.new_pod().unwrap()).collect();
    let (result, ips0) = add(&tb, pods[0]);
    let (_, ips1) = add(&tb, pods[1]);
    // One address per family, on the pod's interface (index 1), each with its family's gateway.
    assert_eq!(result["ips"][0]["address"], "10.247.0.2/24");
    assert_eq!(result["ips"][1]["address"], "fd00:10:247::2/64");
    assert_eq!(result["ips"][1]["gateway"], V6_GATEWAY);
    assert_eq!(result["ips"][1]["interface"], 1);
    let routes: Vec<&str> = result["routes"].as_array().unwrap().iter().map(|r| r["dst"].as_str().unwrap()).collect();
    assert_eq!(routes, ["0.0.0.0/0", "::/0"]);
    let (ns0, ns1) = (tb.pods[pods[0]].netns.name.clone(), tb.pods[pods[1]].netns.name.clone());

    // IPv6 pod → pod: straight into the other pod, and the server sees the client's address.
    let before = tb.forwarded(ForwardPath::PodToPod).unwrap();
    let server_ip: Ipv6Addr = ips1[1].parse().unwrap();
    let listener = in_netns(&ns1, move || Ok(TcpListener::bind(SocketAddrV6::new(server_ip, 8080, 0, 0))?)).unwrap();
    let server = std::thread::spawn(move || -> anyhow::Result<(SocketAddr, String)> {
        let (mut stream, peer) = listener.accept()?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        let mut asked = [0u8; 5];
        stream.read_exact(&mut asked)?;
        stream.write_all(b"pong!")?;
        Ok((peer, String::from_utf8_lossy(&asked).into_owned()))
    });
    let to = SocketAddr::V6(SocketAddrV6::new(server_ip, 8080, 0, 0));
    let answer = in_netns(&ns0, move || {
        let mut stream = TcpStream::connect_timeout(&to, SOCKET_TIMEOUT)?;
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        stream.write_all(b"ping!")?;
        let mut answer = [0u8; 5];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    })
    .unwrap();
    assert_eq!(&answer, b"pong!");
    let (peer, asked) = server.join().unwrap().unwrap();
    assert_eq!((peer.ip().to_string(), asked.as_str()), (ips0[1].clone(), "ping!"), "the server saw the client pod");
    assert!(tb.forwarded(ForwardPath::PodToPod).unwrap() >= before + 6, "TCP took the pod-to-pod path");

    // UDP, and ping both ways; IPv4 unchanged beside it.
    let udp_server = in_netns(&ns1, move || {
        let socket = UdpSocket::bind(SocketAddrV6::new(server_ip, 5353, 0, 0))?;
        socket.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(socket)
    })
    .unwrap();
    let udp_to = SocketAddrV6::new(server_ip, 5353, 0, 0);
    in_netns(&ns0, move || Ok(UdpSocket::bind("[::]:0")?.send_to(b"x", udp_to)?)).unwrap();
    let mut buf = [0u8; 8];
    let (_, from) = udp_server.recv_from(&mut buf).unwrap();
    assert_eq!(from.ip().to_string(), ips0[1], "UDP arrived from the client pod's address");
    assert!(ping6(&ns1, &ips0[1]), "pod 1 → pod 0 over IPv6");
    assert!(tb.ping(&ns0, &ips1[0]), "pod 0 → pod 1 over IPv4");

    // Node ↔ pod over IPv6 (the node's /128 routes; the pod's default route via its gateway).
    for (pod, ns) in [(0, &ns0), (1, &ns1)] {
        let ip = if pod == 0 { &ips0[1] } else { &ips1[1] };
        assert!(ping6(&tb.node.name, ip), "node → pod {pod}");
        assert!(ping6(ns, NODE_IPV6), "pod {pod} → node");
    }
    // The pods' kernels sent nothing the datapath took for a forgery (link-local NS/NA and MLD
    // from their own addresses). Their gateway came resolved (a permanent entry, see
    // scale.rs's neighbours_are_resolved_ahead); the responder's answer to a solicitation for
    // it is checked below.
    assert_eq!(tb.drops(DropReason::SpoofedSource).unwrap(), 0);
    assert_eq!(tb.drops(DropReason::UnsupportedProtocol).unwrap(), 0);
    assert_eq!(tb.drops(DropReason::SpoofedNeighbor).unwrap(), 0);

    // CHECK agrees; DEL leaves no address file, endpoint (3 per pod: v4, v6, link-local) or veth.
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), 6);
    let mut check_conf = tb.conf("1.1.0");
    check_conf["prevResult"] = result;
    let out = tb.cni("CHECK", pods[0], &check_conf).unwrap();
    assert!(out.success, "CHECK of a dual-stack pod: {} {}", out.stdout, out.stderr);
    for &pod in &pods {
        tb.del(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    assert!(tb.host_veths().unwrap().is_empty());
}

#[test]
fn forged_ipv6_sources_and_advertisements_are_dropped() {
    let Some(mut tb) = testbed("forged_ipv6_sources_and_advertisements_are_dropped", "ds6f", &[V4_SUBNET, V6_SUBNET])
    else {
        return;
    };
    let pods: Vec<usize> = (0..2).map(|_| tb.new_pod().unwrap()).collect();
    let (result, ips0) = add(&tb, pods[0]);
    let (_, ips1) = add(&tb, pods[1]);
    let ns0 = tb.pods[pods[0]].netns.name.clone();
    let mac = |v: &Value| -> [u8; 6] {
        let bytes: Vec<u8> = v.as_str().unwrap().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        bytes.try_into().unwrap()
    };
    let (host_mac, pod_mac) = (mac(&result["interfaces"][0]["mac"]), mac(&result["interfaces"][1]["mac"]));
    let own: Ipv6Addr = ips0[1].parse().unwrap();
    let other: Ipv6Addr = ips1[1].parse().unwrap();
    let socket = PacketSocket::open(&ns0, "eth0").unwrap();
    let frame = |src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]| {
        [frames::ethernet(host_mac, pod_mac, 0x86dd), frames::ipv6_icmp(src, dst, message)].concat()
    };
    let echo = [128, 0, 0, 0, 0, 1, 0, 1];

    // Another pod's address, an address of nobody, a made-up link-local one: SpoofedSource each.
    let forged: [Ipv6Addr; 3] = [other, "fd00:10:247::99".parse().unwrap(), "fe80::99".parse().unwrap()];
    for (n, src) in forged.into_iter().enumerate() {
        let before = tb.drops(DropReason::SpoofedSource).unwrap();
        socket.send(&frame(src, other, &echo)).unwrap();
        assert_eq!(tb.drops(DropReason::SpoofedSource).unwrap(), before + 1, "forged source {n}: {src}");
    }
    // A link-local source (the pod's own) beyond its link.
    let link_local = ebpf_link_local(pod_mac);
    let before = tb.drops(DropReason::SpoofedSource).unwrap();
    socket.send(&frame(link_local, other, &echo)).unwrap();
    assert_eq!(tb.drops(DropReason::SpoofedSource).unwrap(), before + 1, "link-local source to a pod");

    // An advertisement claiming the other pod's address, or the pod's own with another MAC.
    for (target, claimed_mac) in [(other, pod_mac), (own, [2, 0, 0, 0, 0, 9])] {
        let before = tb.drops(DropReason::SpoofedNeighbor).unwrap();
        let advert = frames::neighbor_message(136, target, claimed_mac);
        socket.send(&frame(own, "ff02::1".parse().unwrap(), &advert)).unwrap();
        assert_eq!(tb.drops(DropReason::SpoofedNeighbor).unwrap(), before + 1, "advertisement for {target}");
    }

    // A solicitation for the gateway gets the host veth's MAC back, with a valid checksum.
    let gateway: Ipv6Addr = V6_GATEWAY.parse().unwrap();
    socket.received();
    let solicit = frames::neighbor_message(135, gateway, pod_mac);
    socket.send(&frame(own, solicited_node(gateway), &solicit)).unwrap();
    let answers: Vec<Vec<u8>> =
        socket.received().into_iter().filter(|f| f.len() >= 86 && f[12..14] == [0x86, 0xdd] && f[54] == 136).collect();
    assert_eq!(answers.len(), 1, "one advertisement answered the solicitation");
    let answer = &answers[0];
    assert_eq!((&answer[0..6], &answer[6..12]), (&pod_mac[..], &host_mac[..]), "to the pod, from the gateway MAC");
    assert_eq!(&answer[22..38], &gateway.octets(), "from the gateway's address");
    assert_eq!(&answer[38..54], &own.octets(), "to the pod's address");
    assert_eq!(answer[21], 255, "hop limit 255");
    assert_eq!(&answer[62..78], &gateway.octets(), "for the gateway");
    assert_eq!(&answer[78..86], &[&[2, 1][..], &host_mac[..]].concat()[..], "with the host veth's MAC");
    assert!(frames::icmpv6_checksum_valid(answer), "checksum of the advertisement");
}

#[test]
fn ipv6_only_pods_get_one_address_and_reach_each_other() {
    let Some(mut tb) = testbed("ipv6_only_pods_get_one_address_and_reach_each_other", "ds6o", &[V6_SUBNET]) else {
        return;
    };
    let pods: Vec<usize> = (0..2).map(|_| tb.new_pod().unwrap()).collect();
    let (result, _) = add(&tb, pods[0]);
    let (_, ips1) = add(&tb, pods[1]);
    assert_eq!(result["ips"].as_array().unwrap().len(), 1);
    assert_eq!(result["routes"], json!([{ "dst": "::/0", "gw": V6_GATEWAY }]));
    assert!(ping6(&tb.pods[pods[0]].netns.name, &ips1[0]), "pod 0 → pod 1");
    assert!(ping6(&tb.node.name, &ips1[0]), "node → pod 1");
    assert_eq!(tb.drops(DropReason::SpoofedSource).unwrap(), 0);
    for &pod in &pods {
        tb.del(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// The link-local address a pod's kernel derives from its MAC (EUI-64).
fn ebpf_link_local(mac: [u8; 6]) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 2, b, c, 0xff, 0xfe, d, e, f])
}

/// The solicited-node multicast address a solicitation for `target` goes to.
fn solicited_node(target: Ipv6Addr) -> Ipv6Addr {
    let t = target.octets();
    Ipv6Addr::from([0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15]])
}
