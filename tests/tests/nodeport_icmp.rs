//! ICMP errors of Service flows translated per packet (`ebpf/src/service/icmp_error.rs`): node 1
//! of a LAN with `kubeProxyReplacement`, the LAN's `host` calling its NodePorts, `ext` (the
//! LAN's router) sending errors about them. Checks: a router's "fragmentation needed" about the
//! node's packet to the client teaches the backend the path MTU (its route cache), a local one
//! and one on node 2 (behind the node's SNAT: towards node 1); a UDP
//! datagram to a backend port nobody listens on comes back to the client as a port unreachable
//! from the address it dialled, quoting its own datagram (a local backend, and one on node 2
//! behind the node's SNAT); forged errors (a tuple without a live flow, addressed to someone
//! else, about an error, truncated, from a pod about a flow it does not have) are not
//! translated, reach no pod and create no state.
use std::{
    io::{Read as _, Write as _},
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    frames::{checksum, checksums_valid, ethernet, ipv4, tcp, with_checksums},
    lan::{LAN_HOST, LAN_NODE_IPS, LAN_ROUTER, Lan, LanPod, link_mac},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_UNSPEC, expect, run},
    run_in,
    traffic::{PacketSocket, icmp_listener, in_netns, tcp_connect, tcp_listener},
};
use ebpf_common::{ForwardPath, names};

const ETH_IPV4: u16 = 0x0800;
const ACK: u8 = 0x10;
const PAYLOAD: &[u8] = b"a query of thirty-two bytes, ok?";
/// The path MTU the router reports.
const MTU: u16 = 1200;
const TCP_BACKEND: u16 = 9100;
const UDP_CLOSED: u16 = 9101;
const CLIENT_PORT: u16 = 41_234;

/// An IPv4 packet as an ICMP error quotes it: header and L4 checksums right.
fn quoted(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    with_checksums([ethernet([0; 6], [0; 6], ETH_IPV4), ipv4(src, dst, proto, l4)].concat())[14..].to_vec()
}

/// An ICMP error of `kind` (type, code) with 4 more bytes `rest`, quoting `quote`, from `src`
/// to `dst` in a frame to `to_mac`.
fn icmp_error(to_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, kind: (u8, u8), rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let message = [&[kind.0, kind.1, 0, 0][..], &rest, quote].concat();
    with_checksums([ethernet(to_mac, [2; 6], ETH_IPV4), ipv4(src, dst, 1, &message)].concat())
}

/// "Fragmentation needed" with the next hop's MTU.
fn frag_needed(to_mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, quote: &[u8]) -> Vec<u8> {
    let mtu = MTU.to_be_bytes();
    icmp_error(to_mac, src, dst, (3, 4), [0, 0, mtu[0], mtu[1]], quote)
}

/// A TCP header from `src_port` to `dst_port` with sequence number `seq`.
fn tcp_seq(src_port: u16, dst_port: u16, seq: u32) -> Vec<u8> {
    let mut h = tcp(src_port, dst_port, ACK);
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h
}

/// Whether the quoted IPv4 header at `at` and its L4 checksum (`l4_len` bytes quoted) are right.
fn quote_valid(frame: &[u8], at: usize, l4_len: usize) -> bool {
    let ip = &frame[at..at + 20];
    let l4 = &frame[at + 20..at + 20 + l4_len];
    let pseudo = [&ip[12..20], &[0, ip[9]], &(l4_len as u16).to_be_bytes()[..]].concat();
    checksum(ip) == 0 && checksum(&[pseudo, l4.to_vec()].concat()) == 0
}

/// A TCP connection from `client_ns`'s `client_port` to `to`, served in `backend_ns` (one
/// exchange): both ends, kept open while held.
fn kept_open(client_ns: &str, backend_ns: &str, to: SocketAddr, client_port: u16) -> (TcpStream, TcpStream) {
    let listener = tcp_listener(backend_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, TCP_BACKEND)).unwrap();
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
    // The client's ACK of the answer on its way.
    std::thread::sleep(Duration::from_millis(100));
    (stream, served)
}

/// The next sequence number the node sent on `client_port`'s flow from `frontend_port`, read from
/// the frames `capture` (on the client's link) saw.
fn next_seq(capture: &PacketSocket, node: Ipv4Addr, frontend_port: u16, client_port: u16) -> u32 {
    let mut next = None;
    for f in capture.received() {
        let from_flow = f.len() >= 54
            && f[12..14] == ETH_IPV4.to_be_bytes()
            && f[23] == 6
            && f[26..30] == node.octets()
            && f[34..36] == frontend_port.to_be_bytes()
            && f[36..38] == client_port.to_be_bytes();
        if !from_flow {
            continue;
        }
        let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
        let data = total - 20 - usize::from(f[46] >> 4) * 4;
        let syn_fin = usize::from(f[47] & 0x03 != 0);
        let seq = u32::from_be_bytes([f[38], f[39], f[40], f[41]]);
        next = Some(seq.wrapping_add((data + syn_fin) as u32));
    }
    next.expect("no segment of the flow captured")
}

/// The path MTU `netns`'s route cache holds towards `to`, waiting up to 2 s for it to appear.
fn route_mtu(netns: &str, to: &str) -> Option<u16> {
    let started = Instant::now();
    loop {
        let out = run_in(netns, "ip", &["route", "get", to]).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mtu = text.split_whitespace().skip_while(|w| *w != "mtu").nth(1).and_then(|m| m.parse().ok());
        if mtu.is_some() || started.elapsed() > Duration::from_secs(2) {
            println!("route in {netns}: {}", text.trim());
            return mtu;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A connected UDP datagram from `netns` to `to`: the error its socket reports (an ICMP port
/// unreachable matching its flow: ECONNREFUSED), or `None` if something answered.
fn udp_error(netns: &str, to: SocketAddr) -> Option<i32> {
    in_netns(netns, move || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(PAYLOAD)?;
        let mut buf = [0u8; 64];
        Ok(socket.recv(&mut buf).err().map(|e| e.raw_os_error().unwrap_or(-1)))
    })
    .unwrap()
}

/// The ICMP port unreachables `socket` (a raw ICMP socket) received: outer source, quoted
/// source and destination with ports.
fn port_unreachables(socket: &socket2::Socket) -> Vec<(Ipv4Addr, SocketAddrV4, SocketAddrV4)> {
    let mut seen = Vec::new();
    socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    while let Ok(n) = socket.recv(&mut buf) {
        // SAFETY: `recv` initialised the first `n` bytes.
        let p: Vec<u8> = buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
        let ihl = usize::from(p[0] & 0x0f) * 4;
        if p.len() < ihl + 8 + 28 || (p[ihl], p[ihl + 1]) != (3, 3) {
            continue;
        }
        let q = &p[ihl + 8..];
        let qihl = usize::from(q[0] & 0x0f) * 4;
        let addr = |a: &[u8]| Ipv4Addr::new(a[0], a[1], a[2], a[3]);
        let port = |at: usize| u16::from_be_bytes([q[qihl + at], q[qihl + at + 1]]);
        let outer_src = addr(&p[12..16]);
        seen.push((
            outer_src,
            SocketAddrV4::new(addr(&q[12..16]), port(0)),
            SocketAddrV4::new(addr(&q[16..20]), port(2)),
        ));
    }
    seen
}

/// Whether any ICMP packet is among the frames `capture` saw.
fn saw_icmp(capture: &PacketSocket) -> bool {
    capture.received().iter().any(|f| f.len() > 34 && f[12..14] == ETH_IPV4.to_be_bytes() && f[23] == 1)
}

#[test]
fn icmp_errors_of_nodeport_flows_are_translated() {
    let test = "icmp_errors_of_nodeport_flows_are_translated";
    let Some(mut lan) = Lan::for_test(test, "npi", "10.193.0.0/16", ["10.193.1.0/24", "10.193.2.0/24"]) else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    lan.use_kube_proxy_replacement(0, &cgroup, "10.193.0.0/16", None);
    let a = lan.add_pod(0).unwrap();
    let b = lan.add_pod(1).unwrap();
    let (host, ext) = (lan.host.name.clone(), lan.ext.name.clone());
    let node1_mac = link_mac(&lan.nodes[0].node.name, "eth0").unwrap();
    let node: Ipv4Addr = LAN_NODE_IPS[0].parse().unwrap();
    let (client, router): (Ipv4Addr, Ipv4Addr) = (LAN_HOST.parse().unwrap(), LAN_ROUTER.parse().unwrap());
    lan.service_set(0, "0.0.0.0:30100", "tcp", &[format!("{}:{TCP_BACKEND}", a.ip)], &[]);
    lan.service_set(0, "0.0.0.0:30101", "udp", &[format!("{}:{UDP_CLOSED}", a.ip)], &[]);
    lan.service_set(0, "0.0.0.0:30102", "udp", &[format!("{}:{UDP_CLOSED}", b.ip)], &[]);
    lan.service_set(0, "0.0.0.0:30103", "tcp", &[format!("{}:{TCP_BACKEND}", b.ip)], &[]);
    let tb = &lan.nodes[0];

    // (a) A TCP flow to a local backend, kept open; the router then reports a smaller MTU on
    // the client's path, quoting the node's last segment to the client.
    let capture = PacketSocket::open(&host, "eth0").unwrap();
    let flow = kept_open(&host, &a.netns, SocketAddr::new(node.into(), 30100), CLIENT_PORT);
    let seq = next_seq(&capture, node, 30100, CLIENT_PORT);
    let quote = quoted(node, client, 6, &tcp_seq(30100, CLIENT_PORT, seq));
    let error = frag_needed(node1_mac, router, node, &quote);

    // Through the pinned program first: what it makes of the error, byte by byte.
    let (verdict, out) = run(tb, names::SVC_FROM_UPLINK, "eth0", error.clone());
    assert_eq!(verdict, TC_ACT_REDIRECT, "the frag-needed was not delivered");
    assert_eq!((&out[26..30], &out[30..34]), (&router.octets()[..], &a.ip.octets()[..]), "outer addresses");
    let inner = 42;
    assert_eq!(&out[inner + 12..inner + 20], &[a.ip.octets(), client.octets()].concat()[..], "quoted addresses");
    assert_eq!(&out[inner + 20..inner + 24], &[TCP_BACKEND.to_be_bytes(), CLIENT_PORT.to_be_bytes()].concat()[..]);
    assert!(checksums_valid(&out), "outer or ICMP checksum");
    assert!(quote_valid(&out, inner, 20), "quoted checksums");

    // Then on the wire, from the router: the backend's kernel takes it for its flow.
    let ext_link = PacketSocket::open(&ext, "eth0").unwrap();
    let mut live = error.clone();
    live[6..12].copy_from_slice(&link_mac(&ext, "eth0").unwrap());
    let translated = tb.forwarded(ForwardPath::ServiceTranslated).unwrap();
    ext_link.send(&live).unwrap();
    assert_eq!(route_mtu(&a.netns, LAN_HOST), Some(MTU), "the backend did not learn the path MTU");
    assert!(tb.forwarded(ForwardPath::ServiceTranslated).unwrap() > translated, "not counted");

    // The same to a backend on node 2 (SNAT): it learns the MTU towards node 1, which it
    // knows the client by.
    let remote_port = CLIENT_PORT + 2;
    let remote = kept_open(&host, &b.netns, SocketAddr::new(node.into(), 30103), remote_port);
    let seq2 = next_seq(&capture, node, 30103, remote_port);
    let mut live = frag_needed(node1_mac, router, node, &quoted(node, client, 6, &tcp_seq(30103, remote_port, seq2)));
    live[6..12].copy_from_slice(&link_mac(&ext, "eth0").unwrap());
    ext_link.send(&live).unwrap();
    assert_eq!(route_mtu(&b.netns, LAN_NODE_IPS[0]), Some(MTU), "the remote backend did not learn the path MTU");
    drop(remote);

    // (b) A datagram to a backend port nobody listens on: the client's socket gets the port
    // unreachable (its kernel matched the quote to its own datagram), from the node's address.
    let icmp = icmp_listener(&host).unwrap();
    for (what, port) in [("local backend", 30101), ("backend on node 2 (SNAT)", 30102)] {
        let got = udp_error(&host, SocketAddr::new(node.into(), port));
        assert_eq!(got, Some(libc::ECONNREFUSED), "{what}: {got:?}");
        let seen = port_unreachables(&icmp);
        println!("{what}: port unreachables {seen:?}");
        let ok = seen
            .iter()
            .any(|(src, from, to)| *src == node && *from.ip() == client && *to == SocketAddrV4::new(node, port));
        assert!(ok, "{what}: no port unreachable from {node} quoting the datagram to port {port}: {seen:?}");
    }

    // The flow stays open: the forged errors below name it.
    attacks(&lan, &a, node1_mac, (node, client, router), seq);
    drop(flow);

    drop(capture);
    lan.del_pod(0, 0).unwrap();
    lan.del_pod(1, 0).unwrap();
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}

/// Forged errors: untranslated (the node's stack gets them, as before), no pod sees them, no
/// state. `seq` is the live flow's (host:CLIENT_PORT ↔ node:30100).
fn attacks(
    lan: &Lan,
    a: &LanPod,
    node1_mac: [u8; 6],
    (node, client, router): (Ipv4Addr, Ipv4Addr, Ipv4Addr),
    seq: u32,
) {
    let tb = &lan.nodes[0];
    let entries = tb.map_len("SVC_CT").unwrap();
    let unchanged = |name: &str, what: &str, frame: Vec<u8>| {
        let out = expect(tb, name, "eth0", what, frame.clone(), TC_ACT_UNSPEC, None);
        assert_eq!(out, frame, "{what}: rewritten");
    };
    let live_quote = quoted(node, client, 6, &tcp_seq(30100, CLIENT_PORT, seq));
    // A tuple without a live flow (another client port).
    let stray = quoted(node, client, 6, &tcp_seq(30100, CLIENT_PORT + 1, seq));
    unchanged(names::SVC_FROM_UPLINK, "error quoting no flow", frag_needed(node1_mac, router, node, &stray));
    // The live flow's quote, addressed to another host than the quote's source.
    let other: Ipv4Addr = LAN_NODE_IPS[1].parse().unwrap();
    unchanged(names::SVC_FROM_UPLINK, "error to another address", frag_needed(node1_mac, router, other, &live_quote));
    // From a local pod's address (forged on the LAN).
    unchanged(names::SVC_FROM_UPLINK, "error from a pod's address", frag_needed(node1_mac, a.ip, node, &live_quote));
    // Truncated: the quote stops inside the ports.
    unchanged(names::SVC_FROM_UPLINK, "truncated quote", frag_needed(node1_mac, router, node, &live_quote[..22]));
    // An error about an error.
    let inner_error = quoted(node, client, 1, &[3, 3, 0, 0, 0, 0, 0, 0]);
    unchanged(names::SVC_FROM_UPLINK, "error about an error", frag_needed(node1_mac, router, node, &inner_error));
    // From the backend: an error about a flow it does not have, and one naming another pod
    // as the quote's destination.
    let stray_in = quoted(client, a.ip, 6, &tcp_seq(CLIENT_PORT + 1, TCP_BACKEND, 1));
    unchanged(names::SVC_TO_UPLINK, "pod's error about no flow", frag_needed([4; 6], a.ip, client, &stray_in));
    let live_in = quoted(client, a.ip, 6, &tcp_seq(CLIENT_PORT, TCP_BACKEND, 1));
    let not_a: Ipv4Addr = "10.193.1.250".parse().unwrap();
    unchanged(names::SVC_TO_UPLINK, "error for another pod's flow", frag_needed([4; 6], not_a, client, &live_in));
    assert_eq!(tb.map_len("SVC_CT").unwrap(), entries, "an ICMP error changed SVC_CT");

    // On the wire: a forged error quoting no live flow reaches no pod.
    let pod_link = PacketSocket::open(&a.netns, "eth0").unwrap();
    let _ = pod_link.received();
    let ext_link = PacketSocket::open(&lan.ext.name, "eth0").unwrap();
    let mut frame = frag_needed(node1_mac, router, node, &stray);
    frame[6..12].copy_from_slice(&link_mac(&lan.ext.name, "eth0").unwrap());
    ext_link.send(&frame).unwrap();
    assert!(!saw_icmp(&pod_link), "a forged ICMP error reached the pod");
}
