//! A pod stays in its lane: frames written by hand from inside a pod (a packet socket, as a
//! compromised container could) cannot claim another pod's or the node's address, in IPv4 or
//! in ARP, cannot reach another pod by addressing its MAC, and the pinned maps that steer all of
//! this are readable by root alone.
use std::{net::Ipv4Addr, os::unix::fs::PermissionsExt as _};

use ebpf_cni_tests::{
    Attached, NODE_IP, Testbed,
    frames::{self, ethernet},
    run,
    traffic::PacketSocket,
};
use ebpf_common::DropReason;

/// Bytes no real traffic carries: what the victim's sniffer looks for.
const MARKER: &[u8] = b"ebpf-cni-isolation-probe";

/// A UDP datagram carrying [`MARKER`] in an IPv4 packet: nothing is meant to deliver it.
fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    frames::ipv4_udp(src, dst, MARKER)
}

/// An ARP packet (`oper` 1 request, 2 reply) claiming `sender_ip` is at `sender_mac`.
fn arp(oper: u16, sender_mac: [u8; 6], sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Vec<u8> {
    [
        &[0, 1, 8, 0, 6, 4][..],
        &oper.to_be_bytes(),
        &sender_mac,
        &sender_ip.octets(),
        &[0; 6],
        &target_ip.octets(),
        MARKER,
    ]
    .concat()
}

fn carries_marker(frames: &[Vec<u8>]) -> bool {
    frames.iter().any(|f| f.windows(MARKER.len()).any(|w| w == MARKER))
}

/// Sends `frame` from pod `a`, asserts `b` never saw it and that `reason` counted it.
fn blocked(tb: &Testbed, from: &PacketSocket, victim: &PacketSocket, what: &str, frame: Vec<u8>, reason: DropReason) {
    let before = tb.drops(reason).unwrap();
    victim.received();
    from.send(&frame).unwrap();
    assert!(!carries_marker(&victim.received()), "{what}: the other pod received it");
    // At least one: the pods' own kernels send IPv6 router solicitations at moments of their
    // choosing, which count as `UnsupportedProtocol` too until IPv6 is supported.
    let after = tb.drops(reason).unwrap();
    assert!(after > before, "{what}: not counted as {reason:?} ({before} before, {after} after)");
}

#[test]
fn a_pod_cannot_impersonate_or_reach_around_the_datapath() {
    let Some(mut tb) =
        Testbed::for_test("a_pod_cannot_impersonate_or_reach_around_the_datapath", "lane", "10.220.0.0/24")
    else {
        return;
    };
    let (pa, pb) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let (a, b): (Attached, Attached) = (tb.add_attachment(pa).unwrap(), tb.add_attachment(pb).unwrap());
    let sock_a = PacketSocket::open(&tb.pods[pa].netns.name, "eth0").unwrap();
    let sock_b = PacketSocket::open(&tb.pods[pb].netns.name, "eth0").unwrap();
    let node_ip: Ipv4Addr = NODE_IP.parse().unwrap();
    let to_gw = |ether_type| ethernet(a.host_mac, a.pod_mac, ether_type);
    let to_b_mac = |ether_type| ethernet(b.pod_mac, a.pod_mac, ether_type);

    // The control: a's own address reaches b, so the sniffer would see a leak.
    sock_b.received();
    sock_a.send(&[to_gw(0x0800), ipv4_udp(a.ip, b.ip)].concat()).unwrap();
    assert!(carries_marker(&sock_b.received()), "a frame with a's own address did not reach b");

    let spoof = DropReason::SpoofedSource;
    blocked(&tb, &sock_a, &sock_b, "IPv4 from b's address", [to_gw(0x0800), ipv4_udp(b.ip, b.ip)].concat(), spoof);
    let from_node = [to_gw(0x0800), ipv4_udp(node_ip, b.ip)].concat();
    blocked(&tb, &sock_a, &sock_b, "IPv4 from the node's address", from_node, spoof);
    let unused: Ipv4Addr = "10.220.0.250".parse().unwrap();
    blocked(
        &tb,
        &sock_a,
        &sock_b,
        "IPv4 from an unused pod address",
        [to_gw(0x0800), ipv4_udp(unused, b.ip)].concat(),
        spoof,
    );

    // ARP: claiming b's address (gratuitous, as a reply, or asking in its name) and the node's.
    let arp_spoof = DropReason::SpoofedArp;
    let broadcast =
        |oper, ip, target| [ethernet([0xff; 6], a.pod_mac, 0x0806), arp(oper, a.pod_mac, ip, target)].concat();
    blocked(&tb, &sock_a, &sock_b, "gratuitous ARP for b's address", broadcast(1, b.ip, b.ip), arp_spoof);
    blocked(&tb, &sock_a, &sock_b, "ARP reply as b", broadcast(2, b.ip, b.ip), arp_spoof);
    blocked(&tb, &sock_a, &sock_b, "ARP request in b's name", broadcast(1, b.ip, unused), arp_spoof);
    blocked(&tb, &sock_a, &sock_b, "ARP as the node", broadcast(1, node_ip, b.ip), arp_spoof);

    // Straight to b's MAC: other ethertypes, and IPv4 to an address that is no pod's.
    let raw = [to_b_mac(0x88b5), MARKER.to_vec()].concat();
    blocked(&tb, &sock_a, &sock_b, "experimental ethertype to b's MAC", raw, DropReason::UnsupportedProtocol);
    let vlan = [to_b_mac(0x8100), vec![0, 7, 8, 0], ipv4_udp(a.ip, b.ip)].concat();
    blocked(&tb, &sock_a, &sock_b, "VLAN-tagged frame to b's MAC", vlan, DropReason::UnsupportedProtocol);
    let short = [to_b_mac(0x0800), vec![0x45; 10], MARKER.to_vec()].concat()[..24].to_vec();
    blocked(&tb, &sock_a, &sock_b, "truncated IPv4 header", short, DropReason::Malformed);
    sock_b.received();
    sock_a.send(&[to_b_mac(0x0800), ipv4_udp(a.ip, unused)].concat()).unwrap();
    assert!(!carries_marker(&sock_b.received()), "IPv4 to an unused address, sent to b's MAC, reached b");
    // A broadcast ARP request for b is answered by the responder and never reaches b.
    sock_a.received();
    sock_b.received();
    sock_a.send(&broadcast(1, a.ip, b.ip)).unwrap();
    assert!(!carries_marker(&sock_b.received()), "a's ARP request reached b: the pods share a link");
    let answers = sock_a.received();
    let answer = answers.iter().find(|f| f.len() >= 42 && f[12..14] == [8, 6] && f[20..22] == [0, 2]);
    assert_eq!(answer.map(|f| &f[22..28]), Some(&a.host_mac[..]), "ARP for b not answered with a's gateway MAC");

    tb.del(pa).unwrap();
    tb.del(pb).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn pinned_maps_are_root_only() {
    let Some(mut tb) = Testbed::for_test("pinned_maps_are_root_only", "perm", "10.219.0.0/24") else {
        return;
    };
    // An operator (or an older install) created the root open to everyone.
    std::fs::create_dir_all(tb.bpffs_root()).unwrap();
    std::fs::set_permissions(tb.bpffs_root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pod = tb.new_pod().unwrap();
    tb.add(pod).unwrap();
    for dir in [tb.bpffs_root(), tb.pin_dir(), tb.version_dir(), tb.version_dir().join("maps")] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} has mode {mode:o}", dir.display());
    }
    // An unprivileged user can neither list the pins nor open a map by its path.
    let root = tb.bpffs_root();
    let map = tb.map_pin("ENDPOINTS");
    let as_nobody = |args: &[&str]| {
        let mut full = vec!["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
        full.extend_from_slice(args);
        run("setpriv", &full)
    };
    let listed = as_nobody(&["ls", root.to_str().unwrap()]).unwrap_err();
    assert!(format!("{listed}").contains("Permission denied"), "{listed}");
    assert!(as_nobody(&["bpftool", "map", "show", "pinned", map.to_str().unwrap()]).is_err());
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
