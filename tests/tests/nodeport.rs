//! Issue 25, per-packet Service translation for traffic that does not come from a local socket:
//! node 1 of a LAN with `kubeProxyReplacement` and not one iptables or nft rule; the LAN's
//! `host` (outside the cluster) calls node 1's NodePorts, a LoadBalancer IP routed to node 1,
//! and frontends without endpoint. Checks: TCP and UDP to a local backend (the client's address
//! kept) and to one on node 2 (externalTrafficPolicy Cluster: the backend sees node 1's
//! address), policy Local (client kept; without a local endpoint nothing is forwarded), a
//! frontend without endpoint answered at once (RST, ICMP port unreachable), hairpin from a pod
//! through the socket LB; attacks as crafted frames through the pinned programs: forged
//! ACK/RST/FIN create no state, a SYN flood from one source is bounded, packets not matching the
//! state are not translated, a short datagram gets no larger answer; nothing left after the DELs.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    frames::{checksums_valid, ethernet, ipv4, ipv4_udp, ipv6, ipv6_checksum_valid, tcp, with_checksums},
    lan::{Ipv6Plan, LAN_HOST, LAN_HOST_V6, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan, LanPod, at, link_mac},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, expect, run},
    run_in,
    service_probe::{TCP_PORT, Tagged, UDP_PORT},
    traffic::in_netns,
};
use ebpf_common::{DropReason, ForwardPath, SVC_CLIENT_NEW_FLOWS, names};

const ETH_IPV4: u16 = 0x0800;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
const FIN: u8 = 0x01;
/// Long enough to be quoted by a port unreachable (a datagram shorter than its answer gets none).
const PAYLOAD: &[u8] = b"a query of thirty-two bytes, ok?";
const PAYLOAD6: &[u8] = b"a query of sixty-four bytes for IPv6's longer port unreachable..";

/// What a client in `netns` got from `to`: the reply, or the error's errno, and how long it took.
#[derive(Debug)]
enum Answer {
    Reply(String),
    Error(i32, Duration),
}

fn tcp_call(netns: &str, to: SocketAddr) -> Answer {
    in_netns(netns, move || {
        let started = Instant::now();
        let mut stream = match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
            Ok(s) => s,
            Err(e) => return Ok(Answer::Error(e.raw_os_error().unwrap_or(-1), started.elapsed())),
        };
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"q")?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf)?;
        Ok(Answer::Reply(String::from_utf8_lossy(&buf[..n]).into_owned()))
    })
    .unwrap()
}

fn udp_call(netns: &str, to: SocketAddr) -> Answer {
    in_netns(netns, move || {
        let socket = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        // Connected: an ICMP port unreachable comes back as ECONNREFUSED on the socket.
        socket.connect(to)?;
        let started = Instant::now();
        // Long enough to be quoted: IPv6's port unreachable is 110 bytes.
        socket.send(if to.is_ipv4() { PAYLOAD } else { PAYLOAD6 })?;
        let mut buf = [0u8; 64];
        match socket.recv(&mut buf) {
            Ok(n) => Ok(Answer::Reply(String::from_utf8_lossy(&buf[..n]).into_owned())),
            Err(e) => Ok(Answer::Error(e.raw_os_error().unwrap_or(-1), started.elapsed())),
        }
    })
    .unwrap()
}

fn node1(port: u16) -> SocketAddr {
    SocketAddr::new(LAN_NODE_IPS[0].parse().unwrap(), port)
}

fn node1_v6(port: u16) -> SocketAddr {
    SocketAddr::new(LAN_NODE_IPV6S[0].parse().unwrap(), port)
}

/// Node 1's uplink MAC: crafted frames from the LAN are addressed to it, as the node's own
/// (the Service programs leave a frame for another host, or a broadcast, alone).
static NODE1_MAC: std::sync::OnceLock<[u8; 6]> = std::sync::OnceLock::new();

fn node1_mac() -> [u8; 6] {
    *NODE1_MAC.get().expect("node 1's MAC is read first")
}

/// A crafted frame from the LAN through node 1's `svc_from_uplink`.
fn from_lan(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    with_checksums([ethernet(node1_mac(), [2; 6], ETH_IPV4), ipv4(src, dst, proto, l4)].concat())
}

/// The hairpin client: a pod's process in the socket LB's cgroup calling its own node's NodePort.
fn hairpin(cgroup: &TestCgroup, pod: &LanPod, to: SocketAddr) -> String {
    let script = "import socket,sys\ns=socket.create_connection((sys.argv[1],int(sys.argv[2])),3)\n\
                  s.sendall(b'q');print(s.recv(64).decode(),flush=True)";
    let mut command = Command::new("nsenter");
    command.arg(format!("--net=/run/netns/{}", pod.netns)).args(["python3", "-c", script]);
    command.args([to.ip().to_string(), to.port().to_string()]).stdout(Stdio::piped()).stdin(Stdio::null());
    cgroup.confine(&mut command).unwrap();
    let mut child = command.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _ = child.wait();
    line.trim().to_string()
}

#[test]
fn nodeports_are_translated_per_packet() {
    let test = "nodeports_are_translated_per_packet";
    let plan = Ipv6Plan { cluster_cidr: "fd00:10:97::/56", subnets: ["fd00:10:97:1::/64", "fd00:10:97:2::/64"] };
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "npt", "10.197.0.0/16", ["10.197.1.0/24", "10.197.2.0/24"], plan)
    else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    let cluster = format!("10.197.0.0/16,{}", plan.cluster_cidr);
    lan.use_kube_proxy_replacement(0, &cgroup, &cluster, Some(plan.subnets[0]));
    let (a, c) = (lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap());
    let b = lan.add_pod(1).unwrap();
    let (_a, _b) = (Tagged::naming_peers(&a.netns, "A"), Tagged::naming_peers(&b.netns, "B"));
    let host = lan.host.name.clone();
    let node1_ns = lan.nodes[0].node.name.clone();
    let _ = NODE1_MAC.set(link_mac(&node1_ns, "eth0").unwrap());

    // No kube-proxy: not one rule in node 1's netfilter.
    let ruleset = run_in(&node1_ns, "nft", &["list", "ruleset"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&ruleset.stdout).trim(), "", "node 1 has nft rules");
    let saved = run_in(&node1_ns, "iptables-save", &[]).unwrap();
    assert!(!String::from_utf8_lossy(&saved.stdout).contains("\n-A "), "node 1 has iptables rules");
    // The Service programs run first on the uplink.
    let filters = run_in(&node1_ns, "tc", &["filter", "show", "dev", "eth0", "ingress"]).unwrap();
    let filters = String::from_utf8_lossy(&filters.stdout).to_string();
    let first = filters.lines().find(|l| l.contains("direct-action")).unwrap_or_default();
    assert!(first.contains(names::SVC_FROM_UPLINK), "svc_from_uplink is not first: {filters}");

    let set = |f: &str, p: &str, backends: &[String], extra: &[&str]| lan.service_set(0, f, p, backends, extra);
    set("0.0.0.0:30080", "tcp", &[at(a.ip, TCP_PORT)], &[]);
    set("0.0.0.0:30053", "udp", &[at(a.ip, UDP_PORT)], &[]);
    set("0.0.0.0:30081", "tcp", &[at(b.ip, TCP_PORT)], &[]);
    set("0.0.0.0:30054", "udp", &[at(b.ip, UDP_PORT)], &[]);
    set("0.0.0.0:30082", "tcp", &[at(a.ip, TCP_PORT)], &["--local"]);
    set("0.0.0.0:30055", "udp", &[at(a.ip, UDP_PORT)], &["--local"]);
    set("0.0.0.0:30083", "tcp", &[], &["--local"]);
    set("0.0.0.0:30090", "tcp", &[], &[]);
    set("0.0.0.0:30091", "udp", &[], &[]);
    set("192.0.2.200:80", "tcp", &[at(a.ip, TCP_PORT)], &["--external"]);
    let (a6, b6) = (a.ip6.unwrap(), b.ip6.unwrap());
    set("[::]:30080", "tcp", &[at(a6, TCP_PORT)], &[]);
    set("[::]:30053", "udp", &[at(a6, UDP_PORT)], &[]);
    set("[::]:30081", "tcp", &[at(b6, TCP_PORT)], &[]);
    set("[::]:30054", "udp", &[at(b6, UDP_PORT)], &[]);
    set("[::]:30082", "tcp", &[at(a6, TCP_PORT)], &["--local"]);
    set("[::]:30090", "tcp", &[], &[]);
    set("[::]:30091", "udp", &[], &[]);
    // A ClusterIP is not reached from the LAN.
    set("10.96.0.10:80", "tcp", &[at(a.ip, TCP_PORT)], &[]);
    run_in(&host, "ip", &["route", "add", "192.0.2.200/32", "via", LAN_NODE_IPS[0]]).unwrap();
    run_in(&host, "ip", &["route", "add", "10.96.0.10/32", "via", LAN_NODE_IPS[0]]).unwrap();

    let tb = &lan.nodes[0];
    let (translated, replied) =
        (tb.forwarded(ForwardPath::ServiceTranslated).unwrap(), tb.forwarded(ForwardPath::ServiceReply).unwrap());
    let mut failures = Vec::new();
    let mut check = |what: &str, got: Answer, want: &str| {
        let ok = matches!(&got, Answer::Reply(r) if r == want);
        println!("{what}: {got:?}{}", if ok { "" } else { "  <-- FAILED" });
        if !ok {
            failures.push(format!("{what}: {got:?}, expected {want:?}"));
        }
    };
    // Local backend: the client's address kept.
    check("TCP NodePort, local backend", tcp_call(&host, node1(30080)), &format!("A {LAN_HOST}"));
    check("UDP NodePort, local backend", udp_call(&host, node1(30053)), &format!("A {LAN_HOST}"));
    // Backend on node 2 (policy Cluster): it sees node 1's address.
    check("TCP NodePort, remote backend", tcp_call(&host, node1(30081)), &format!("B {}", LAN_NODE_IPS[0]));
    check("UDP NodePort, remote backend", udp_call(&host, node1(30054)), &format!("B {}", LAN_NODE_IPS[0]));
    // Policy Local: the client's address.
    check("TCP NodePort, policy Local", tcp_call(&host, node1(30082)), &format!("A {LAN_HOST}"));
    check("UDP NodePort, policy Local", udp_call(&host, node1(30055)), &format!("A {LAN_HOST}"));
    // A LoadBalancer IP routed to node 1.
    let lb = SocketAddr::new("192.0.2.200".parse().unwrap(), 80);
    check("TCP LoadBalancer IP", tcp_call(&host, lb), &format!("A {LAN_HOST}"));
    // IPv6, the same ways.
    let (host6, node6) = (LAN_HOST_V6, LAN_NODE_IPV6S[0]);
    check("IPv6 TCP NodePort, local backend", tcp_call(&host, node1_v6(30080)), &format!("A {host6}"));
    check("IPv6 UDP NodePort, local backend", udp_call(&host, node1_v6(30053)), &format!("A {host6}"));
    check("IPv6 TCP NodePort, remote backend", tcp_call(&host, node1_v6(30081)), &format!("B {node6}"));
    check("IPv6 UDP NodePort, remote backend", udp_call(&host, node1_v6(30054)), &format!("B {node6}"));
    check("IPv6 TCP NodePort, policy Local", tcp_call(&host, node1_v6(30082)), &format!("A {host6}"));
    // A second round on the same frontends: new flows, state reused nowhere wrongly.
    check("TCP NodePort again", tcp_call(&host, node1(30081)), &format!("B {}", LAN_NODE_IPS[0]));

    // Translated by the Service programs, both ways.
    let counted = |path| tb.forwarded(path).unwrap();
    assert!(counted(ForwardPath::ServiceTranslated) > translated, "nothing counted as service-translated");
    assert!(counted(ForwardPath::ServiceReply) > replied, "nothing counted as service-reply");
    println!("SVC_CT holds {} entries after these flows", tb.map_len("SVC_CT").unwrap());

    // Policy Local without a local endpoint: not forwarded, counted.
    let dropped = tb.drops(DropReason::ServiceNoLocalEndpoint).unwrap();
    let got = tcp_call(&host, node1(30083));
    println!("policy Local, no local endpoint: {got:?}");
    assert!(matches!(got, Answer::Error(..)), "forwarded: {got:?}");
    assert!(tb.drops(DropReason::ServiceNoLocalEndpoint).unwrap() > dropped, "not counted");
    // A ClusterIP from the LAN: not translated (the node has no such address either).
    let got = tcp_call(&host, SocketAddr::new("10.96.0.10".parse().unwrap(), 80));
    assert!(matches!(got, Answer::Error(..)), "a ClusterIP answered from the LAN: {got:?}");

    // No endpoint: answered at once (RST → ECONNREFUSED; port unreachable → ECONNREFUSED).
    let refused = tb.drops(DropReason::ServiceNoEndpoint).unwrap();
    let calls = [
        ("TCP", tcp_call(&host, node1(30090))),
        ("UDP", udp_call(&host, node1(30091))),
        ("IPv6 TCP", tcp_call(&host, node1_v6(30090))),
        ("IPv6 UDP", udp_call(&host, node1_v6(30091))),
    ];
    for (what, got) in calls {
        println!("{what} no endpoint: {got:?}");
        match got {
            Answer::Error(errno, took) => {
                assert_eq!(errno, libc::ECONNREFUSED, "{what}: errno {errno}");
                assert!(took < Duration::from_millis(100), "{what}: not at once: {took:?}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(tb.drops(DropReason::ServiceNoEndpoint).unwrap(), refused + 4);

    // Hairpin: a pod calling its own node's NodePort is a local socket: the socket LB.
    let got = hairpin(&cgroup, &c, node1(30080));
    assert_eq!(got, format!("A {}", c.ip), "hairpin");
    assert!(failures.is_empty(), "failed flows:\n{}", failures.join("\n"));

    attacks(&lan, &a, &b);

    // Nothing left once the pods are gone.
    run_in(&host, "ip", &["route", "del", "192.0.2.200/32"]).unwrap();
    run_in(&host, "ip", &["route", "del", "10.96.0.10/32"]).unwrap();
    for pod in 0..2 {
        lan.del_pod(0, pod).unwrap();
    }
    lan.del_pod(1, 0).unwrap();
    let filters = run_in(&node1_ns, "tc", &["filter", "show", "dev", "eth0", "ingress"]).unwrap();
    assert!(!String::from_utf8_lossy(&filters.stdout).contains("svc_"), "Service filters left");
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}

/// Crafted frames through node 1's pinned Service programs.
fn attacks(lan: &Lan, a: &LanPod, b: &LanPod) {
    let tb = &lan.nodes[0];
    let node_ip: Ipv4Addr = LAN_NODE_IPS[0].parse().unwrap();
    let attacker: Ipv4Addr = "192.0.2.77".parse().unwrap();
    let entries = || tb.map_len("SVC_CT").unwrap();

    // Forged ACK, RST, FIN to a NodePort: no state, not translated (the stack's to answer).
    let before = entries();
    for (what, flags) in [("ACK", ACK), ("RST", RST | ACK), ("FIN", FIN | ACK)] {
        let frame = from_lan(attacker, node_ip, 6, &tcp(40_000, 30080, flags));
        let out = expect(tb, names::SVC_FROM_UPLINK, "eth0", what, frame.clone(), TC_ACT_UNSPEC, None);
        assert_eq!(out, frame, "{what} was rewritten");
    }
    let attacker6: Ipv6Addr = "fd00:192:0:2::77".parse().unwrap();
    let node6: Ipv6Addr = LAN_NODE_IPV6S[0].parse().unwrap();
    let frame = [ethernet(node1_mac(), [2; 6], 0x86dd), ipv6(attacker6, node6, 6, &tcp(40_000, 30080, ACK))].concat();
    let out = expect(tb, names::SVC_FROM_UPLINK6, "eth0", "IPv6 ACK", frame.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, frame, "an IPv6 ACK was rewritten");
    // A SYN from the LAN with a local pod's address: not translated (`from_uplink` drops it).
    let frame = from_lan(a.ip, node_ip, 6, &tcp(40_005, 30080, SYN));
    let out =
        expect(tb, names::SVC_FROM_UPLINK, "eth0", "SYN from a pod's address", frame.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, frame, "a SYN with a local pod's source was translated");
    // A broadcast frame (every node would translate it, each backend answering a forged source)
    // and a SYN with the node's own address as source: neither translated, no state.
    let mut broadcast = from_lan(attacker, node_ip, 6, &tcp(40_006, 30080, SYN));
    broadcast[..6].copy_from_slice(&[0xff; 6]);
    let out = expect(tb, names::SVC_FROM_UPLINK, "eth0", "broadcast SYN", broadcast.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, broadcast, "a broadcast frame was translated");
    let own = from_lan(node_ip, node_ip, 6, &tcp(40_007, 30080, SYN));
    let out =
        expect(tb, names::SVC_FROM_UPLINK, "eth0", "SYN from the node's address", own.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, own, "a SYN with the node's own source was translated");
    assert_eq!(entries(), before, "a forged ACK/RST/FIN or a pod's source created state");

    // Replies that match no state are not translated: a local backend's packet to a client
    // it has no flow with, and a "reply" from node 2's pod to a SNAT port nobody holds.
    let stray = with_checksums(
        [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(a.ip, attacker, 6, &tcp(TCP_PORT, 45_000, SYN | ACK))].concat(),
    );
    let out = expect(tb, names::SVC_TO_UPLINK, "eth0", "stray reply", stray.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, stray, "a stray reply was translated");
    let stray = from_lan(b.ip, node_ip, 6, &tcp(TCP_PORT, 61_234, SYN | ACK));
    let out = expect(tb, names::SVC_FROM_UPLINK, "eth0", "stray remote reply", stray.clone(), TC_ACT_UNSPEC, None);
    assert_eq!(out, stray, "a stray remote reply was translated");

    // No endpoint: the SYN's answer is a RST no longer than the SYN, with valid checksums.
    let syn = from_lan(attacker, node_ip, 6, &tcp(40_001, 30090, SYN));
    let (verdict, rst) = run(tb, names::SVC_FROM_UPLINK, "eth0", syn.clone());
    assert_eq!(verdict, TC_ACT_REDIRECT);
    assert!(rst.len() <= syn.len(), "the RST is larger than the SYN");
    assert_eq!(
        (rst[23], rst[47], &rst[26..30], &rst[30..34]),
        (6, RST | ACK, &node_ip.octets()[..], &attacker.octets()[..])
    );
    assert!(checksums_valid(&rst), "RST checksums");
    // A datagram shorter than its port unreachable would be gets none (no amplification).
    let short = with_checksums([ethernet(node1_mac(), [2; 6], ETH_IPV4), ipv4_udp(attacker, node_ip, b"")].concat());
    let mut short = short;
    short[36..38].copy_from_slice(&30091u16.to_be_bytes());
    let short = with_checksums(short);
    expect(
        tb,
        names::SVC_FROM_UPLINK,
        "eth0",
        "short datagram",
        short,
        TC_ACT_SHOT,
        Some(DropReason::ServiceRejectLimited),
    );
    // One long enough gets an ICMP port unreachable no longer than itself.
    let mut long =
        with_checksums([ethernet(node1_mac(), [2; 6], ETH_IPV4), ipv4_udp(attacker, node_ip, PAYLOAD)].concat());
    long[36..38].copy_from_slice(&30091u16.to_be_bytes());
    let long = with_checksums(long);
    let (verdict, icmp) = run(tb, names::SVC_FROM_UPLINK, "eth0", long.clone());
    assert_eq!(verdict, TC_ACT_REDIRECT);
    assert!(icmp.len() <= long.len(), "the port unreachable is larger than the datagram");
    assert_eq!((icmp[23], icmp[34], icmp[35]), (1, 3, 3), "not a port unreachable");
    assert!(checksums_valid(&icmp), "ICMP checksums");

    // The same for IPv6: a RST of 74 bytes, a port unreachable of 110 quoting the datagram.
    let v6 = |l4: &[u8], proto: u8| [ethernet(node1_mac(), [2; 6], 0x86dd), ipv6(attacker6, node6, proto, l4)].concat();
    let syn6 = v6(&tcp(40_003, 30090, SYN), 6);
    let (verdict, rst6) = run(tb, names::SVC_FROM_UPLINK6, "eth0", syn6.clone());
    assert_eq!(verdict, TC_ACT_REDIRECT, "IPv6 SYN to no endpoint");
    assert_eq!((rst6.len(), rst6[20], rst6[67]), (74, 6, RST | ACK), "IPv6 RST");
    assert!(ipv6_checksum_valid(&rst6[14..]), "IPv6 RST checksum");
    let udp6 = |payload: &[u8]| {
        let mut l4 = [
            &40_004u16.to_be_bytes()[..],
            &30091u16.to_be_bytes(),
            &((8 + payload.len()) as u16).to_be_bytes(),
            &[0, 0],
        ]
        .concat();
        l4.extend_from_slice(payload);
        v6(&l4, 17)
    };
    let (verdict, icmp6) = run(tb, names::SVC_FROM_UPLINK6, "eth0", udp6(PAYLOAD6));
    assert_eq!(verdict, TC_ACT_REDIRECT, "IPv6 datagram to no endpoint");
    assert_eq!((icmp6.len(), icmp6[20], icmp6[54], icmp6[55]), (110, 58, 1, 4), "not a port unreachable");
    assert!(ipv6_checksum_valid(&icmp6[14..]), "ICMPv6 checksum");
    let short = udp6(PAYLOAD);
    expect(
        tb,
        names::SVC_FROM_UPLINK6,
        "eth0",
        "short IPv6 datagram",
        short,
        TC_ACT_SHOT,
        Some(DropReason::ServiceRejectLimited),
    );

    // A SYN flood from one source: its flows stop at its share, counted; the others' go on.
    let flooder: Ipv4Addr = "198.51.100.9".parse().unwrap();
    let before = entries();
    let refused = tb.drops(DropReason::ServiceClientShare).unwrap();
    let extra = 20u32;
    for i in 0..SVC_CLIENT_NEW_FLOWS + extra {
        let frame = from_lan(flooder, node_ip, 6, &tcp(10_000 + i as u16, 30080, SYN));
        let (verdict, _) = run(tb, names::SVC_FROM_UPLINK, "eth0", frame);
        let want = if i < SVC_CLIENT_NEW_FLOWS { TC_ACT_REDIRECT } else { TC_ACT_SHOT };
        assert_eq!(verdict, want, "SYN {i} of the flood");
    }
    assert_eq!(tb.drops(DropReason::ServiceClientShare).unwrap(), refused + u64::from(extra));
    let held = entries() - before;
    assert!(held <= 2 * SVC_CLIENT_NEW_FLOWS as usize, "the flood holds {held} entries");
    println!("a SYN flood of {} from one source holds {held} SVC_CT entries", SVC_CLIENT_NEW_FLOWS + extra);
    // Another client still gets in.
    let frame = from_lan("192.0.2.78".parse().unwrap(), node_ip, 6, &tcp(40_002, 30080, SYN));
    expect(tb, names::SVC_FROM_UPLINK, "eth0", "another client's SYN", frame, TC_ACT_REDIRECT, None);

    // Every entry ages: a flood flow nobody answered is translated while NEW…
    let ack = || from_lan(flooder, node_ip, 6, &tcp(10_000, 30080, ACK));
    expect(tb, names::SVC_FROM_UPLINK, "eth0", "ACK of a NEW flow", ack(), TC_ACT_REDIRECT, None);
    // …and no more once its NEW lifetime is over; the flooder's window is renewed.
    std::thread::sleep(Duration::from_nanos(ebpf_common::SVC_CT_NEW_NS) + Duration::from_millis(500));
    let out = expect(tb, names::SVC_FROM_UPLINK, "eth0", "ACK of an aged flow", ack(), TC_ACT_UNSPEC, None);
    assert_eq!(out, ack(), "an aged flow was translated");
    let frame = from_lan(flooder, node_ip, 6, &tcp(9_000, 30080, SYN));
    expect(tb, names::SVC_FROM_UPLINK, "eth0", "the flooder's SYN a window later", frame, TC_ACT_REDIRECT, None);
}
