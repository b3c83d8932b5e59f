//! `sessionAffinity: ClientIP` for Service flows from the LAN (per-packet path, `nodeport.rs`'s
//! topology): node 1 with `kubeProxyReplacement`, a Service of three backends (two on node 1,
//! one on node 2) on NodePorts. Checks: one LAN client's 20 connections (TCP, UDP, IPv6) reach
//! one backend; a second client address has its own entry; a removed backend's client gets a
//! live one; past `timeoutSeconds` the next flow is a new pick (no affinity hit counted); and a
//! flood of SYNs (and datagrams) from forged sources that never complete a flow leaves no entry
//! in `SVC_AFFINITY`.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    frames::{ethernet, ipv4, tcp, with_checksums},
    lan::{Ipv6Plan, LAN_HOST, LAN_HOST_V6, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan},
    prog_run::run,
    run_in,
    service_probe::{TCP_PORT, Tagged, UDP_PORT},
    traffic::in_netns,
};
use ebpf_common::{FAMILY_IPV4, FAMILY_IPV6, ServiceEvent, names};
use serde_json::Value;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
/// What `lan_affinity.rs` sets in a LAN client's key (bit 63; bit 62 too for IPv6).
const LAN_CLIENT: u64 = 1 << 63;
const LAN_CLIENT_V6: u64 = 1 << 62;
/// A second client address of the LAN's host.
const SECOND_CLIENT: &str = "192.0.2.101";
const CALLS: usize = 20;

/// One request from `from` (an address of the host) to `to`, TCP or UDP; the backend's tag.
fn call(netns: &str, from: IpAddr, to: SocketAddr, udp: bool) -> String {
    in_netns(netns, move || {
        let (kind, protocol) = if udp { (Type::DGRAM, Protocol::UDP) } else { (Type::STREAM, Protocol::TCP) };
        let socket = Socket::new(Domain::for_address(to), kind, Some(protocol))?;
        socket.bind(&SockAddr::from(SocketAddr::new(from, 0)))?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 64];
        let n = if udp {
            socket.connect(&SockAddr::from(to))?;
            let datagram: UdpSocket = socket.into();
            datagram.send(b"q")?;
            datagram.recv(&mut buf)?
        } else {
            socket.connect_timeout(&SockAddr::from(to), Duration::from_secs(2))?;
            let mut stream: TcpStream = socket.into();
            stream.write_all(b"q")?;
            stream.read(&mut buf)?
        };
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })
    .unwrap_or_else(|e| format!("error: {e:#}"))
}

/// The backend every one of `CALLS` requests reached; panics unless they all reached the same.
fn sticky(what: &str, netns: &str, from: IpAddr, to: SocketAddr, udp: bool) -> String {
    let got: Vec<String> = (0..CALLS).map(|_| call(netns, from, to, udp)).collect();
    println!("{what}: {got:?}");
    assert!(got.iter().all(|g| *g == got[0] && !g.starts_with("error")), "{what}: affinity broken: {got:?}");
    got[0].clone()
}

/// A LAN client's key in `SVC_AFFINITY`, IPv4.
fn cookie_v4(client: Ipv4Addr) -> u64 {
    LAN_CLIENT | u64::from(u32::from(client))
}

fn number(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_default()
}

/// An entry of `SVC_AFFINITY`.
#[derive(Debug)]
struct Entry {
    cookie: u64,
    service: u64,
    backend: Vec<u8>,
    last_ns: u64,
}

fn affinity(lan: &Lan) -> Vec<Entry> {
    let dump = lan.nodes[0].map_dump_if_pinned("SVC_AFFINITY").unwrap();
    let entries = dump.as_array().cloned().unwrap_or_default();
    let entry = |e: &Value| {
        let (key, value) = (&e["formatted"]["key"], &e["formatted"]["value"]);
        let backend = value["backend"]["addr"].as_array().unwrap().iter().map(|b| number(b) as u8).collect();
        Entry {
            cookie: number(&key["netns_cookie"]),
            service: number(&key["service"]),
            backend,
            last_ns: number(&value["last_ns"]),
        }
    };
    entries.iter().map(entry).collect()
}

/// The id of the NodePort `port`'s Service (`protocol` 6 or 17, IPv6 or not).
fn service_id(lan: &Lan, port: u16, protocol: u8, v6: bool) -> u64 {
    let family = if v6 { FAMILY_IPV6 } else { FAMILY_IPV4 };
    let dump = lan.nodes[0].map_dump("SVC_FRONTENDS").unwrap();
    let found = dump.as_array().unwrap().iter().map(|e| &e["formatted"]).find(|f| {
        let key = &f["key"];
        (number(&key["port"]), number(&key["protocol"]), number(&key["family"]))
            == (u64::from(port), u64::from(protocol), u64::from(family))
    });
    number(&found.expect("no such NodePort")["value"]["id"])
}

/// The entry of `cookie`'s client for Service `service`.
fn entry_of(lan: &Lan, cookie: u64, service: u64) -> Option<Entry> {
    affinity(lan).into_iter().find(|e| e.cookie == cookie && e.service == service)
}

/// A backend's address as `SVC_AFFINITY` holds it (IPv4 in the first four bytes).
fn held(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => [&v4.octets()[..], &[0; 12]].concat(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

#[test]
fn lan_clients_keep_their_backend() {
    let test = "lan_clients_keep_their_backend";
    let plan = Ipv6Plan { cluster_cidr: "fd00:10:93::/56", subnets: ["fd00:10:93:1::/64", "fd00:10:93:2::/64"] };
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "npa", "10.193.0.0/16", ["10.193.1.0/24", "10.193.2.0/24"], plan)
    else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    let cluster = format!("10.193.0.0/16,{}", plan.cluster_cidr);
    lan.use_kube_proxy_replacement(0, &cgroup, &cluster, Some(plan.subnets[0]));
    let pods = [lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap(), lan.add_pod(1).unwrap()];
    let tags = ["A", "B", "C"];
    let _servers: Vec<Tagged> = pods.iter().zip(tags).map(|(p, t)| Tagged::start(&p.netns, t)).collect();
    let ip_of = |tag: &str| pods[tags.iter().position(|t| *t == tag).unwrap()].ip;
    let host = lan.host.name.clone();
    run_in(&host, "ip", &["addr", "add", &format!("{SECOND_CLIENT}/24"), "dev", "eth0"]).unwrap();

    let all = |port: u16, v6: bool| -> Vec<String> {
        pods.iter()
            .map(|p| SocketAddr::new(if v6 { p.ip6.unwrap().into() } else { p.ip.into() }, port).to_string())
            .collect()
    };
    let hour = ["--affinity-seconds", "3600"];
    lan.service_set(0, "0.0.0.0:30100", "tcp", &all(TCP_PORT, false), &hour);
    lan.service_set(0, "0.0.0.0:30101", "udp", &all(UDP_PORT, false), &hour);
    lan.service_set(0, "0.0.0.0:30102", "tcp", &all(TCP_PORT, false), &["--affinity-seconds", "2"]);
    lan.service_set(0, "[::]:30100", "tcp", &all(TCP_PORT, true), &hour);
    let node1 = |port| SocketAddr::new(LAN_NODE_IPS[0].parse().unwrap(), port);
    let (client, second): (Ipv4Addr, Ipv4Addr) = (LAN_HOST.parse().unwrap(), SECOND_CLIENT.parse().unwrap());

    let (tcp_id, udp_id, short_id) =
        (service_id(&lan, 30100, 6, false), service_id(&lan, 30101, 17, false), service_id(&lan, 30102, 6, false));
    let backend_of = |cookie, id| entry_of(&lan, cookie, id).map(|e| e.backend);

    // One client, one backend, and its entry names it.
    let first = sticky("TCP from the host", &host, client.into(), node1(30100), false);
    assert_eq!(backend_of(cookie_v4(client), tcp_id), Some(held(ip_of(&first).into())), "{:?}", affinity(&lan));
    // A second client address: an entry of its own (its backend may be the same by chance).
    let other = sticky("TCP from a second address", &host, second.into(), node1(30100), false);
    assert_eq!(backend_of(cookie_v4(second), tcp_id), Some(held(ip_of(&other).into())));
    // UDP: recorded by the backend's first reply.
    let udp = sticky("UDP from the host", &host, client.into(), node1(30101), true);
    assert_eq!(backend_of(cookie_v4(client), udp_id), Some(held(ip_of(&udp).into())));
    // IPv6: the client's key is a hash with bits 63 and 62 set.
    let host6: IpAddr = LAN_HOST_V6.parse::<Ipv6Addr>().unwrap().into();
    let node1_v6 = SocketAddr::new(LAN_NODE_IPV6S[0].parse().unwrap(), 30100);
    let first6 = sticky("IPv6 TCP from the host", &host, host6, node1_v6, false);
    let both = LAN_CLIENT | LAN_CLIENT_V6;
    let v6: Vec<Entry> = affinity(&lan).into_iter().filter(|e| e.cookie & both == both).collect();
    let ip6_of = |tag: &str| pods[tags.iter().position(|t| *t == tag).unwrap()].ip6.unwrap();
    assert_eq!(v6.len(), 1, "IPv6 entries: {v6:?}");
    assert_eq!((v6[0].service, &v6[0].backend), (service_id(&lan, 30100, 6, true), &held(ip6_of(&first6).into())));

    // The client's backend removed: it gets a live one, and keeps that one.
    let gone = format!("{}:", ip_of(&first));
    let rest: Vec<String> = all(TCP_PORT, false).into_iter().filter(|b| !b.starts_with(&gone)).collect();
    lan.service_set(0, "0.0.0.0:30100", "tcp", &rest, &hour);
    let moved = sticky("TCP after its backend was removed", &host, client.into(), node1(30100), false);
    assert_ne!(moved, first, "still sent to the removed backend");
    assert_eq!(backend_of(cookie_v4(client), tcp_id), Some(held(ip_of(&moved).into())));

    // Past the timeout (2 s) a new flow is a new pick: within it a hit is counted, after it none.
    let tb = &lan.nodes[0];
    let hits = || tb.service_events(ServiceEvent::AffinityHit).unwrap();
    let last = || entry_of(&lan, cookie_v4(client), short_id).map(|e| e.last_ns);
    call(&host, client.into(), node1(30102), false);
    let (before, recorded) = (hits(), last());
    assert!(recorded.is_some(), "no entry for the short timeout's Service");
    call(&host, client.into(), node1(30102), false);
    assert_eq!(hits(), before + 1, "a flow within the timeout was no affinity hit");
    std::thread::sleep(Duration::from_millis(2_500));
    let expired = hits();
    let got = call(&host, client.into(), node1(30102), false);
    assert_eq!(hits(), expired, "a flow past the timeout still had its previous backend");
    println!("past the timeout: {got}");
    assert!(last() > recorded, "the new pick was not recorded");

    forged_sources_record_nothing(&lan);

    run_in(&host, "ip", &["addr", "del", &format!("{SECOND_CLIENT}/24"), "dev", "eth0"]).unwrap();
    for pod in 0..2 {
        lan.del_pod(0, pod).unwrap();
    }
    lan.del_pod(1, 0).unwrap();
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}

/// SYNs and datagrams from forged sources through node 1's pinned `svc_from_uplink`: each
/// opens a flow (translated, `SVC_CT` entries written), a bare ACK follows (no SYN-ACK came
/// back), and nothing is recorded in `SVC_AFFINITY` for any of them.
fn forged_sources_record_nothing(lan: &Lan) {
    let tb = &lan.nodes[0];
    let (mac, node_ip): ([u8; 6], Ipv4Addr) = (lan.node_mac(0).unwrap(), LAN_NODE_IPS[0].parse().unwrap());
    let entries = affinity(lan).len();
    let ct = tb.map_len("SVC_CT").unwrap();
    let frame = |src: Ipv4Addr, proto: u8, l4: &[u8]| {
        with_checksums([ethernet(mac, [2; 6], 0x0800), ipv4(src, node_ip, proto, l4)].concat())
    };
    let sources: Vec<Ipv4Addr> =
        (0..200u32).map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i)).collect();
    for (i, src) in sources.iter().enumerate() {
        let port = 20_000 + i as u16;
        run(tb, names::SVC_FROM_UPLINK, "eth0", frame(*src, 6, &tcp(port, 30100, SYN)));
        run(tb, names::SVC_FROM_UPLINK, "eth0", frame(*src, 6, &tcp(port, 30100, ACK)));
        let udp = [&port.to_be_bytes()[..], &30101u16.to_be_bytes(), &9u16.to_be_bytes(), &[0, 0, b'q']].concat();
        run(tb, names::SVC_FROM_UPLINK, "eth0", frame(*src, 17, &udp));
    }
    let opened = tb.map_len("SVC_CT").unwrap().saturating_sub(ct);
    println!("{} forged sources opened {opened} SVC_CT entries", sources.len());
    assert!(opened >= sources.len(), "the forged flows were not even opened ({opened} entries)");
    let recorded: Vec<u64> = affinity(lan).into_iter().map(|e| e.cookie).collect();
    let forged: Vec<&Ipv4Addr> = sources.iter().filter(|s| recorded.contains(&cookie_v4(**s))).collect();
    assert!(forged.is_empty(), "affinity recorded for forged sources: {forged:?}");
    assert_eq!(recorded.len(), entries, "SVC_AFFINITY changed under the forged flood");
}
