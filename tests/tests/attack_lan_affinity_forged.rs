//! Attack test (security review of `svc-affinity-lan`): ClientIP affinity for LAN clients must
//! not be recorded for a TCP source address that never completed a handshake.
//!
//! `nodeport_affinity.rs`'s `forged_sources_record_nothing` runs forged SYNs and bare ACKs
//! through `BPF_PROG_TEST_RUN`, where no backend ever answers. On a real LAN the backend does
//! answer the forged SYN (its SYN-ACK goes to the forged address), `SVC_CT` moves to SYN_ACKED,
//! and a blind bare ACK (acknowledgement number 0: our states read flags, not sequence numbers)
//! moves the flow to ESTABLISHED. Before the fix that wrote the forged address's entry; now the
//! entry waits for the backend's first segment without RST, and the backend answers a blind
//! ACK with a RST. UDP has no handshake: the backend's reply to one forged datagram records it,
//! as kube-proxy's `recent` match does for any first packet (printed, not asserted).
//!
//! What it gives an attacker on the LAN, who never sees an answer: (1) pin any address's next
//! flows to a ClientIP Service (for its `timeoutSeconds`) to one backend (with a backend it
//! controls: to that one, by repeating until its backend sees the forged SYN); (2) fill
//! `SVC_AFFINITY` (65,536 entries, an LRU shared with the pods' socket-LB entries) from as many
//! forged addresses, evicting pods' and other clients' affinity (`share.rs` bounds flows per
//! source address, not the number of addresses).
//!
//! Real namespaces (`nodeport.rs`'s LAN): node 1 with `kubeProxyReplacement`, two backends on
//! node 1, the LAN host sends the forged frames through a packet socket on its eth0, from two
//! victim addresses it holds (so node 1 can resolve them; they open no socket: the host's
//! stack answers the SYN-ACK with a RST and the UDP reply with a port unreachable).
use std::{net::Ipv4Addr, time::Duration};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    frames::{ethernet, ipv4, tcp, with_checksums},
    lan::{LAN_NODE_IPS, Lan, at, link_mac},
    run_in,
    service_probe::{TCP_PORT, Tagged, UDP_PORT},
    traffic::PacketSocket,
};
use ebpf_common::FAMILY_IPV4;
use serde_json::Value;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const LAN_CLIENT: u64 = 1 << 63;
/// Addresses of the LAN host that never open a connection (the victims).
const VICTIM_TCP: &str = "192.0.2.150";
const VICTIM_UDP: &str = "192.0.2.151";

fn number(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_default()
}

/// `SVC_AFFINITY` on node 1: (key's netns_cookie, service id).
fn affinity(lan: &Lan) -> Vec<(u64, u64)> {
    let dump = lan.nodes[0].map_dump_if_pinned("SVC_AFFINITY").unwrap();
    let entries = dump.as_array().cloned().unwrap_or_default();
    entries
        .iter()
        .map(|e| (number(&e["formatted"]["key"]["netns_cookie"]), number(&e["formatted"]["key"]["service"])))
        .collect()
}

fn service_id(lan: &Lan, port: u16, protocol: u8) -> u64 {
    let dump = lan.nodes[0].map_dump("SVC_FRONTENDS").unwrap();
    let found = dump.as_array().unwrap().iter().map(|e| &e["formatted"]).find(|f| {
        let key = &f["key"];
        (number(&key["port"]), number(&key["protocol"]), number(&key["family"]))
            == (u64::from(port), u64::from(protocol), u64::from(FAMILY_IPV4))
    });
    number(&found.expect("no such NodePort")["value"]["id"])
}

#[test]
fn forged_handshakes_on_the_lan_record_no_affinity() {
    let test = "forged_handshakes_on_the_lan_record_no_affinity";
    let Some(mut lan) = Lan::for_test(test, "atkaff", "10.177.0.0/16", ["10.177.1.0/24", "10.177.2.0/24"]) else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    lan.use_kube_proxy_replacement(0, &cgroup, "10.177.0.0/16", None);
    let pods = [lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap()];
    let servers: Vec<Tagged> = pods.iter().zip(["A", "B"]).map(|(p, t)| Tagged::start(&p.netns, t)).collect();
    let hour = ["--affinity-seconds", "3600"];
    let backends = |port| pods.iter().map(|p| at(p.ip, port)).collect::<Vec<_>>();
    lan.service_set(0, "0.0.0.0:30110", "tcp", &backends(TCP_PORT), &hour);
    lan.service_set(0, "0.0.0.0:30111", "udp", &backends(UDP_PORT), &hour);
    let (tcp_id, udp_id) = (service_id(&lan, 30110, 6), service_id(&lan, 30111, 17));

    let host = lan.host.name.clone();
    for victim in [VICTIM_TCP, VICTIM_UDP] {
        run_in(&host, "ip", &["addr", "add", &format!("{victim}/24"), "dev", "eth0"]).unwrap();
    }
    let node_ip: Ipv4Addr = LAN_NODE_IPS[0].parse().unwrap();
    let (node_mac, host_mac) = (lan.node_mac(0).unwrap(), link_mac(&host, "eth0").unwrap());
    let frame = |src: Ipv4Addr, proto: u8, l4: &[u8]| {
        with_checksums([ethernet(node_mac, host_mac, 0x0800), ipv4(src, node_ip, proto, l4)].concat())
    };
    let (v_tcp, v_udp): (Ipv4Addr, Ipv4Addr) = (VICTIM_TCP.parse().unwrap(), VICTIM_UDP.parse().unwrap());
    let before = affinity(&lan);
    let socket = PacketSocket::open(&host, "eth0").unwrap();
    let _ = socket.received();

    // TCP: a forged SYN, then (without ever seeing the SYN-ACK) a bare ACK, acknowledging 0.
    socket.send(&frame(v_tcp, 6, &tcp(41_000, 30110, SYN))).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    socket.send(&frame(v_tcp, 6, &tcp(41_000, 30110, ACK))).unwrap();
    // UDP: one forged datagram; the backend answers the victim.
    let udp = [&41_001u16.to_be_bytes()[..], &30111u16.to_be_bytes(), &9u16.to_be_bytes(), &[0, 0, b'q']].concat();
    socket.send(&frame(v_udp, 17, &udp)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let heard = socket.received();
    let syn_acks = heard
        .iter()
        .filter(|f| f.len() > 47 && f[23] == 6 && f[30..34] == v_tcp.octets() && f[47] & (SYN | ACK) == SYN | ACK)
        .count();
    let udp_replies = heard.iter().filter(|f| f.len() > 33 && f[23] == 17 && f[30..34] == v_udp.octets()).count();
    println!("the victims were sent {syn_acks} SYN-ACK(s) and {udp_replies} UDP reply(ies) they never asked for");

    let after = affinity(&lan);
    let recorded: Vec<(u64, u64)> = after.iter().filter(|e| !before.contains(e)).copied().collect();
    println!("SVC_AFFINITY entries written by the forged frames: {recorded:x?}");
    let forged_tcp = recorded.contains(&(LAN_CLIENT | u64::from(u32::from(v_tcp)), tcp_id));
    let forged_udp = recorded.contains(&(LAN_CLIENT | u64::from(u32::from(v_udp)), udp_id));

    drop(socket);
    for victim in [VICTIM_TCP, VICTIM_UDP] {
        run_in(&host, "ip", &["addr", "del", &format!("{victim}/24"), "dev", "eth0"]).unwrap();
    }
    drop(servers);
    for pod in 0..2 {
        lan.del_pod(0, pod).unwrap();
    }
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());

    assert!(!forged_tcp, "TCP: a forged SYN and a blind ACK (ack 0) recorded ClientIP affinity for {VICTIM_TCP}");
    println!("UDP: one forged datagram recorded affinity: {forged_udp} (accepted, see the module's comment)");
}
