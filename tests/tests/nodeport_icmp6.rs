//! ICMPv6 errors of Service flows translated per packet (`ebpf/src/service/icmp_error6.rs`),
//! `nodeport_icmp.rs` for IPv6: node 1 of a dual-stack LAN with `kubeProxyReplacement`, the
//! LAN's `host` calling its IPv6 NodePorts, `ext` (the LAN's router) sending errors about them.
//! Checks: a router's packet too big about the node's segment to the client teaches the local
//! backend the path MTU (its route cache); a UDP datagram to a backend port nobody listens on
//! comes back to the client as a port unreachable from the address it dialled, quoting its own
//! datagram; forged errors (no live flow, addressed to someone else, from a pod's address,
//! truncated, about an error, an echo; a pod's about a flow it does not have) are not
//! translated, reach no pod and change no state.
use std::{
    io::{Read as _, Write as _},
    mem::MaybeUninit,
    net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    frames::{ethernet, ipv6, ipv6_checksum_valid, tcp},
    lan::{Ipv6Plan, LAN_HOST_V6, LAN_NODE_IPV6S, LAN_ROUTER_V6, Lan, LanPod, link_mac},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_UNSPEC, expect, run},
    run_in,
    traffic::{PacketSocket, in_netns, tcp_connect},
};
use ebpf_common::{ForwardPath, names};
use socket2::{Domain, Protocol, Socket, Type};

const ETH_IPV6: u16 = 0x86dd;
const ACK: u8 = 0x10;
const PAYLOAD: &[u8] = b"a query of thirty-two bytes, ok?";
/// The path MTU the router reports: above IPv6's minimum (1280), below the pods' links'.
const MTU: u32 = 1300;
const TCP_BACKEND: u16 = 9100;
const UDP_CLOSED: u16 = 9101;
const CLIENT_PORT: u16 = 41_334;
const PLAN: Ipv6Plan =
    Ipv6Plan { cluster_cidr: "fd00:10:195::/56", subnets: ["fd00:10:195:1::/64", "fd00:10:195:2::/64"] };
/// Where the quoted IPv6 header starts in an Ethernet frame carrying an ICMPv6 error.
const INNER: usize = 14 + 40 + 8;

/// An ICMPv6 error of `kind` (type, code) with 4 more bytes `rest`, quoting `quote`, from `src`
/// to `dst` in a frame to `to_mac`.
fn icmp6_error(to_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, kind: (u8, u8), rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let message = [&[kind.0, kind.1, 0, 0][..], &rest, quote].concat();
    [ethernet(to_mac, [2; 6], ETH_IPV6), ipv6(src, dst, 58, &message)].concat()
}

fn too_big(to_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, quote: &[u8]) -> Vec<u8> {
    icmp6_error(to_mac, src, dst, (2, 0), MTU.to_be_bytes(), quote)
}

/// A TCP header from `src_port` to `dst_port` with sequence number `seq`.
fn tcp_seq(src_port: u16, dst_port: u16, seq: u32) -> Vec<u8> {
    let mut h = tcp(src_port, dst_port, ACK);
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h
}

/// A TCP connection from `client_ns`'s `client_port` to `to`, served in `backend_ns` (one
/// exchange): both ends, kept open while held.
fn kept_open(client_ns: &str, backend_ns: &str, to: SocketAddr, client_port: u16) -> (TcpStream, TcpStream) {
    let listener = in_netns(backend_ns, || Ok(std::net::TcpListener::bind(("::", TCP_BACKEND))?)).unwrap();
    let server = std::thread::spawn(move || -> std::io::Result<TcpStream> {
        let (mut s, _) = listener.accept()?;
        let mut q = [0u8; 1];
        s.read_exact(&mut q)?;
        s.write_all(b"hello")?;
        Ok(s)
    });
    let mut stream = tcp_connect(client_ns, client_port, to).unwrap();
    stream.write_all(b"q").unwrap();
    let mut hello = [0u8; 5];
    stream.read_exact(&mut hello).unwrap();
    let served = server.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    (stream, served)
}

/// The next sequence number the node sent on `client_port`'s flow from `frontend_port`, read
/// from the frames `capture` (on the client's link) saw.
fn next_seq(capture: &PacketSocket, node: Ipv6Addr, frontend_port: u16, client_port: u16) -> u32 {
    let mut next = None;
    for f in capture.received() {
        let from_flow = f.len() >= 74
            && f[12..14] == ETH_IPV6.to_be_bytes()
            && f[20] == 6
            && f[22..38] == node.octets()
            && f[54..56] == frontend_port.to_be_bytes()
            && f[56..58] == client_port.to_be_bytes();
        if !from_flow {
            continue;
        }
        let payload = usize::from(u16::from_be_bytes([f[18], f[19]]));
        let data = payload - usize::from(f[66] >> 4) * 4;
        let syn_fin = usize::from(f[67] & 0x03 != 0);
        let seq = u32::from_be_bytes([f[58], f[59], f[60], f[61]]);
        next = Some(seq.wrapping_add((data + syn_fin) as u32));
    }
    next.expect("no segment of the flow captured")
}

/// The path MTU `netns`'s route cache holds towards `to`, waiting up to 2 s for it to appear.
fn route_mtu(netns: &str, to: &str) -> Option<u32> {
    let started = Instant::now();
    loop {
        let out = run_in(netns, "ip", &["-6", "route", "get", to]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mtu = text.split_whitespace().skip_while(|w| *w != "mtu").nth(1).and_then(|m| m.parse().ok());
        if mtu.is_some() || started.elapsed() > Duration::from_secs(2) {
            println!("route in {netns}: {}", text.trim());
            return mtu;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A connected UDP datagram from `netns` to `to`: the error its socket reports (ECONNREFUSED
/// for a port unreachable matching its flow), or `None` if something answered.
fn udp_error(netns: &str, to: SocketAddr) -> Option<i32> {
    in_netns(netns, move || {
        let socket = UdpSocket::bind("[::]:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(PAYLOAD)?;
        let mut buf = [0u8; 64];
        Ok(socket.recv(&mut buf).err().map(|e| e.raw_os_error().unwrap_or(-1)))
    })
    .unwrap()
}

/// The ICMPv6 port unreachables a raw ICMPv6 socket received: outer source, quoted source and
/// destination with ports.
fn port_unreachables(socket: &Socket) -> Vec<(Ipv6Addr, SocketAddrV6, SocketAddrV6)> {
    let mut seen = Vec::new();
    socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        // SAFETY: `recv_from` initialised the first `n` bytes.
        let p: Vec<u8> = buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
        // A raw ICMPv6 socket gets the message without the IPv6 header.
        if p.len() < 8 + 40 + 8 || (p[0], p[1]) != (1, 4) {
            continue;
        }
        let q = &p[8..];
        let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&q[at..at + 16]).unwrap());
        let port = |at: usize| u16::from_be_bytes([q[40 + at], q[40 + at + 1]]);
        let Some(from) = from.as_socket_ipv6() else { continue };
        seen.push((*from.ip(), SocketAddrV6::new(addr(8), port(0), 0, 0), SocketAddrV6::new(addr(24), port(2), 0, 0)));
    }
    seen
}

/// Whether any ICMPv6 error (types 1 to 4) is among the frames `capture` saw.
fn saw_icmp6_error(capture: &PacketSocket) -> bool {
    capture
        .received()
        .iter()
        .any(|f| f.len() > 54 && f[12..14] == ETH_IPV6.to_be_bytes() && f[20] == 58 && (1..=4).contains(&f[54]))
}

#[test]
fn icmpv6_errors_of_nodeport_flows_are_translated() {
    let test = "icmpv6_errors_of_nodeport_flows_are_translated";
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "np6", "10.195.0.0/16", ["10.195.1.0/24", "10.195.2.0/24"], PLAN)
    else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    let cluster = format!("10.195.0.0/16,{}", PLAN.cluster_cidr);
    lan.use_kube_proxy_replacement(0, &cgroup, &cluster, Some(PLAN.subnets[0]));
    let a = lan.add_pod(0).unwrap();
    let a6 = a.ip6.unwrap();
    let (host, ext) = (lan.host.name.clone(), lan.ext.name.clone());
    let node1_mac = link_mac(&lan.nodes[0].node.name, "eth0").unwrap();
    let node: Ipv6Addr = LAN_NODE_IPV6S[0].parse().unwrap();
    let (client, router): (Ipv6Addr, Ipv6Addr) = (LAN_HOST_V6.parse().unwrap(), LAN_ROUTER_V6.parse().unwrap());
    lan.service_set(0, "[::]:30100", "tcp", &[format!("[{a6}]:{TCP_BACKEND}")], &[]);
    lan.service_set(0, "[::]:30101", "udp", &[format!("[{a6}]:{UDP_CLOSED}")], &[]);
    let tb = &lan.nodes[0];

    // (a) A TCP flow to a local backend, kept open; the router then reports a smaller MTU on the
    // client's path, quoting the node's last segment to the client.
    let capture = PacketSocket::open(&host, "eth0").unwrap();
    let flow = kept_open(&host, &a.netns, SocketAddr::new(node.into(), 30100), CLIENT_PORT);
    let seq = next_seq(&capture, node, 30100, CLIENT_PORT);
    let quote = ipv6(node, client, 6, &tcp_seq(30100, CLIENT_PORT, seq));
    let error = too_big(node1_mac, router, node, &quote);

    // Through the pinned program first: what it makes of the error, byte by byte.
    let (verdict, out) = run(tb, names::SVC_FROM_UPLINK6, "eth0", error.clone());
    assert_eq!(verdict, TC_ACT_REDIRECT, "the packet too big was not delivered");
    assert_eq!((&out[22..38], &out[38..54]), (&router.octets()[..], &a6.octets()[..]), "outer addresses");
    assert_eq!(&out[INNER + 8..INNER + 40], &[a6.octets(), client.octets()].concat()[..], "quoted addresses");
    let ports = [TCP_BACKEND.to_be_bytes(), CLIENT_PORT.to_be_bytes()].concat();
    assert_eq!(&out[INNER + 40..INNER + 44], &ports[..], "quoted ports");
    assert!(ipv6_checksum_valid(&out[14..]), "ICMPv6 checksum");
    assert!(ipv6_checksum_valid(&out[INNER..]), "quoted TCP checksum");

    // Then on the wire, from the router: the backend's kernel takes it for its flow.
    let ext_link = PacketSocket::open(&ext, "eth0").unwrap();
    let mut live = error.clone();
    live[6..12].copy_from_slice(&link_mac(&ext, "eth0").unwrap());
    let translated = tb.forwarded(ForwardPath::ServiceTranslated).unwrap();
    ext_link.send(&live).unwrap();
    assert_eq!(route_mtu(&a.netns, LAN_HOST_V6), Some(MTU), "the backend did not learn the path MTU");
    assert!(tb.forwarded(ForwardPath::ServiceTranslated).unwrap() > translated, "not counted");

    // (b) A datagram to a backend port nobody listens on: the client's socket gets the port
    // unreachable (its kernel matched the quote to its own datagram), from the node's address.
    let icmp = in_netns(&host, || Ok(Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?)).unwrap();
    let got = udp_error(&host, SocketAddr::new(node.into(), 30101));
    assert_eq!(got, Some(libc::ECONNREFUSED), "{got:?}");
    let seen = port_unreachables(&icmp);
    println!("port unreachables {seen:?}");
    let ok = seen
        .iter()
        .any(|(src, from, to)| *src == node && *from.ip() == client && *to == SocketAddrV6::new(node, 30101, 0, 0));
    assert!(ok, "no port unreachable from {node} quoting the datagram to port 30101: {seen:?}");

    // The flow stays open: the forged errors below name it.
    attacks(&lan, &a, node1_mac, (node, client, router), seq);
    drop(flow);

    drop(capture);
    lan.del_pod(0, 0).unwrap();
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}

/// Forged errors: untranslated (the node's stack gets them, as before), no pod sees them, no
/// state. `seq` is the live flow's (host:CLIENT_PORT ↔ node:30100).
fn attacks(
    lan: &Lan,
    a: &LanPod,
    node1_mac: [u8; 6],
    (node, client, router): (Ipv6Addr, Ipv6Addr, Ipv6Addr),
    seq: u32,
) {
    let tb = &lan.nodes[0];
    let a6 = a.ip6.unwrap();
    let entries = tb.map_len("SVC_CT").unwrap();
    let unchanged = |name: &str, what: &str, frame: Vec<u8>| {
        let out = expect(tb, name, "eth0", what, frame.clone(), TC_ACT_UNSPEC, None);
        assert_eq!(out, frame, "{what}: rewritten");
    };
    let from_lan = |what: &str, frame: Vec<u8>| unchanged(names::SVC_FROM_UPLINK6, what, frame);
    let live_quote = ipv6(node, client, 6, &tcp_seq(30100, CLIENT_PORT, seq));
    // A tuple without a live flow (another client port).
    let stray = ipv6(node, client, 6, &tcp_seq(30100, CLIENT_PORT + 1, seq));
    from_lan("error quoting no flow", too_big(node1_mac, router, node, &stray));
    // The live flow's quote, addressed to another host than the quote's source.
    let other: Ipv6Addr = LAN_NODE_IPV6S[1].parse().unwrap();
    from_lan("error to another address", too_big(node1_mac, router, other, &live_quote));
    // From a local pod's address (forged on the LAN), and from a link-local one.
    from_lan("error from a pod's address", too_big(node1_mac, a6, node, &live_quote));
    from_lan("error from link-local", too_big(node1_mac, "fe80::1".parse().unwrap(), node, &live_quote));
    // Truncated: the quote stops inside the ports.
    from_lan("truncated quote", too_big(node1_mac, router, node, &live_quote[..42]));
    // An error about an error.
    let inner_error = ipv6(node, client, 58, &[1, 4, 0, 0, 0, 0, 0, 0]);
    from_lan("error about an error", too_big(node1_mac, router, node, &inner_error));
    // An echo request quoting the flow is no error.
    let echo = icmp6_error(node1_mac, router, node, (128, 0), [0, 1, 0, 1], &live_quote);
    from_lan("echo request", echo);
    // From the backend: an error about a flow it does not have, and one naming another pod as
    // the quote's destination.
    let unreachable = |src: Ipv6Addr, quote: &[u8]| icmp6_error([4; 6], src, client, (1, 4), [0; 4], quote);
    let stray_in = ipv6(client, a6, 6, &tcp_seq(CLIENT_PORT + 1, TCP_BACKEND, 1));
    unchanged(names::SVC_TO_UPLINK6, "pod's error about no flow", unreachable(a6, &stray_in));
    let live_in = ipv6(client, a6, 6, &tcp_seq(CLIENT_PORT, TCP_BACKEND, 1));
    let not_a: Ipv6Addr = "fd00:10:195:1::fa".parse().unwrap();
    unchanged(names::SVC_TO_UPLINK6, "error for another pod's flow", unreachable(not_a, &live_in));
    assert_eq!(tb.map_len("SVC_CT").unwrap(), entries, "an ICMPv6 error changed SVC_CT");

    // On the wire: a forged error quoting no live flow reaches no pod.
    let pod_link = PacketSocket::open(&a.netns, "eth0").unwrap();
    let _ = pod_link.received();
    let ext_link = PacketSocket::open(&lan.ext.name, "eth0").unwrap();
    let mut frame = too_big(node1_mac, router, node, &stray);
    frame[6..12].copy_from_slice(&link_mac(&lan.ext.name, "eth0").unwrap());
    ext_link.send(&frame).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!saw_icmp6_error(&pod_link), "a forged ICMPv6 error reached the pod");
}
