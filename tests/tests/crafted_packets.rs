//! The programs themselves, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): the
//! pinned programs of a real node with two pods, each frame given as if it arrived on a pod's
//! host veth (or the uplink). Every odd frame gets the documented verdict and drop reason.
use std::net::Ipv4Addr;

use ebpf_cni_tests::{
    Cluster, EXT_SERVER, NODE1_UPLINK_IP,
    frames::{checksum, checksums_valid, with_checksums},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, expect, run_arrived, try_run},
};
use ebpf_common::DropReason;
const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const UDP: u8 = 17;

fn ethernet(dst: [u8; 6], src: [u8; 6], ether_type: u16) -> Vec<u8> {
    [&dst[..], &src[..], &ether_type.to_be_bytes()[..]].concat()
}

/// An IPv4 header (with `options`, and the fragment field as given) and `payload`.
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, options: &[u8], frag: u16, payload: &[u8]) -> Vec<u8> {
    let header_len = 20 + options.len();
    let total = (header_len + payload.len()) as u16;
    let mut h = vec![0x40 | (header_len / 4) as u8, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0, 1]);
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(options);
    let sum = h.chunks(2).fold(0u32, |acc, w| acc + u32::from(u16::from_be_bytes([w[0], w[1]])));
    let folded = !(((sum & 0xffff) + (sum >> 16)) as u16);
    h[10..12].copy_from_slice(&folded.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

fn udp(src_port: u16, dst_port: u16, body: &[u8]) -> Vec<u8> {
    let len = (8 + body.len()) as u16;
    [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &len.to_be_bytes(), &[0, 0], body].concat()
}

#[test]
fn crafted_frames_get_their_documented_verdicts() {
    let Some(mut c) = Cluster::for_test(
        "crafted_frames_get_their_documented_verdicts",
        "craft",
        "10.221.0.0/16",
        ["10.221.1.0/24", "10.221.2.0/24"],
    ) else {
        return;
    };
    let tb = &mut c.nodes[0];
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let (a, b) = (tb.add_attachment(a).unwrap(), tb.add_attachment(b).unwrap());
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let node_ip: Ipv4Addr = NODE1_UPLINK_IP.parse().unwrap();
    let from_a = |ether_type: u16| ethernet(a.host_mac, a.pod_mac, ether_type);
    let datagram = udp(40000, 53, b"query");
    let a_to = |dst: Ipv4Addr, options: &[u8], frag: u16| {
        [from_a(ETH_IPV4), ipv4(a.ip, dst, UDP, options, frag, &datagram)].concat()
    };
    let from_pod = |what: &str, frame: Vec<u8>, verdict: u32, reason: Option<DropReason>| {
        expect(tb, "from_pod", &a.host_ifname, what, frame, verdict, reason)
    };

    // Truncated and malformed headers. The kernel's test run itself refuses an IPv4 or IPv6
    // frame shorter than its fixed header (a live one, sent from a pod through a packet
    // socket, is dropped as Malformed: see the isolation tests).
    for (what, frame) in [
        ("Ethernet header only", from_a(ETH_IPV4)),
        ("IPv4 header cut at 12 bytes", [from_a(ETH_IPV4), ipv4(a.ip, b.ip, UDP, &[], 0, &[])[..12].to_vec()].concat()),
        ("IPv6 header cut at 16 bytes", [from_a(0x86dd), vec![0x60; 16]].concat()),
    ] {
        let refused = try_run(tb, "from_pod", &a.host_ifname, frame).expect_err(what);
        assert!(format!("{refused:?}").contains("Invalid argument"), "{what}: {refused:?}");
    }
    from_pod("unknown ethertype, no payload", from_a(0x88b5), TC_ACT_SHOT, Some(DropReason::UnsupportedProtocol));
    let mut bad_ihl = a_to(b.ip, &[], 0);
    bad_ihl[14] = 0x43; // header length 12 bytes
    from_pod("IPv4 header length 12", bad_ihl, TC_ACT_SHOT, Some(DropReason::Malformed));
    let mut bad_version = a_to(b.ip, &[], 0);
    bad_version[14] = 0x65;
    from_pod("version 6 in an IPv4 frame", bad_version, TC_ACT_SHOT, Some(DropReason::Malformed));
    let short_arp = [from_a(ETH_ARP), vec![0, 1, 8, 0, 6, 4]].concat();
    from_pod("ARP cut at 6 bytes", short_arp, TC_ACT_SHOT, Some(DropReason::Malformed));

    // Ethertypes other than IPv4 and ARP.
    let ipv6 = [from_a(0x86dd), vec![0x60; 40]].concat();
    from_pod("IPv6", ipv6, TC_ACT_SHOT, Some(DropReason::UnsupportedProtocol));
    let vlan = [from_a(0x8100), vec![0, 5], ETH_IPV4.to_be_bytes().to_vec(), ipv4(a.ip, b.ip, UDP, &[], 0, &datagram)]
        .concat();
    from_pod("802.1Q VLAN tag", vlan, TC_ACT_SHOT, Some(DropReason::UnsupportedProtocol));
    from_pod("LLDP", [from_a(0x88cc), vec![0; 32]].concat(), TC_ACT_SHOT, Some(DropReason::UnsupportedProtocol));

    // Another pod's source address on this pod's veth.
    let spoofed = [from_a(ETH_IPV4), ipv4(b.ip, b.ip, UDP, &[], 0, &datagram)].concat();
    from_pod("source of another pod", spoofed, TC_ACT_SHOT, Some(DropReason::SpoofedSource));

    // Pod to pod: options and fragments are delivered as they are, MACs rewritten for b.
    for (what, options, frag) in [
        ("plain", &[][..], 0),
        ("IP options (4 NOPs)", &[1, 1, 1, 1][..], 0),
        ("first fragment", &[][..], 0x2000),
        ("later fragment", &[][..], 185),
    ] {
        let out = from_pod(what, a_to(b.ip, options, frag), TC_ACT_REDIRECT, None);
        assert_eq!(out[..6], b.pod_mac, "{what}: destination MAC");
        assert_eq!(out[6..12], b.host_mac, "{what}: source MAC");
    }
    // Outside the cluster: to the node's stack, then masquerade on the uplink.
    from_pod("to the outside", a_to(ext, &[], 0), TC_ACT_UNSPEC, None);

    let to_uplink = |what: &str, frame: Vec<u8>, verdict: u32, reason: Option<DropReason>| {
        expect(tb, "to_uplink", "uplink0", what, frame, verdict, reason)
    };
    let from_uplink = |what: &str, frame: Vec<u8>, verdict: u32, reason: Option<DropReason>| {
        expect(tb, "from_uplink", "uplink0", what, frame, verdict, reason)
    };
    let out = to_uplink("UDP with IP options", a_to(ext, &[1, 1, 1, 1], 0), TC_ACT_UNSPEC, None);
    assert_eq!(out[26..30], node_ip.octets(), "masqueraded source");
    // Fragments: the first finds the flow by its ports, the later ones follow it by their
    // identification; a later one with no first seen cannot be translated.
    let first = to_uplink("first fragment", a_to(ext, &[], 0x2000), TC_ACT_UNSPEC, None);
    assert_eq!(first[26..30], node_ip.octets(), "first fragment's source");
    let later = to_uplink("later fragment", a_to(ext, &[], 185), TC_ACT_UNSPEC, None);
    assert_eq!(later[26..30], node_ip.octets(), "later fragment's source");
    assert_eq!(later[34..], a_to(ext, &[], 185)[34..], "a later fragment's payload is not a header");
    let mut orphan = a_to(ext, &[], 185);
    orphan[18..20].copy_from_slice(&[0x77, 0x77]);
    let orphan = with_checksums_ip_only(orphan);
    to_uplink("later fragment, first unseen", orphan, TC_ACT_SHOT, Some(DropReason::NatUntranslatable));
    let gre = [from_a(ETH_IPV4), ipv4(a.ip, ext, 47, &[], 0, &[0; 8])].concat();
    to_uplink("GRE", gre, TC_ACT_SHOT, Some(DropReason::NatUntranslatable));
    let short_udp = [from_a(ETH_IPV4), ipv4(a.ip, ext, UDP, &[], 0, &[0; 4])].concat();
    to_uplink("UDP header cut at 4 bytes", short_udp, TC_ACT_SHOT, Some(DropReason::Malformed));
    to_uplink("IPv6", [from_a(0x86dd), vec![0x60; 40]].concat(), TC_ACT_UNSPEC, None);

    // The reply to the UDP flow above gets pod a's address and port back and goes on into the
    // stack, whose conntrack saw a's side; anything else to the node continues into it.
    let port = u16::from_be_bytes([out[34 + 4], out[34 + 5]]);
    assert!((1_024..=29_999).contains(&port), "port {port} is not of the default masqPortRange");
    let from_ext = |proto: u8, l4: &[u8]| {
        with_checksums([ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, node_ip, proto, &[], 0, l4)].concat())
    };
    let delivered = from_uplink("reply", from_ext(UDP, &udp(53, port, b"answer")), TC_ACT_UNSPEC, None);
    assert_eq!(delivered[30..34], a.ip.octets(), "reply not translated back to the pod");
    assert_eq!(delivered[36..38], 40000u16.to_be_bytes(), "reply not given the pod's port back");
    assert!(checksums_valid(&delivered), "reply's checksums");
    from_uplink("no flow", from_ext(UDP, &udp(53, 1, b"?")), TC_ACT_UNSPEC, None);

    // TCP and ICMP echo, both ways, with their checksums.
    for (what, proto, l4, id_at) in
        [("TCP SYN", 6, tcp(40001, 443, 0x02), 0), ("ICMP echo request", 1, icmp_echo(8, 0x1234), 4)]
    {
        let request = with_checksums([from_a(ETH_IPV4), ipv4(a.ip, ext, proto, &[], 0, &l4)].concat());
        let out = to_uplink(what, request, TC_ACT_UNSPEC, None);
        assert_eq!(out[26..30], node_ip.octets(), "{what}: masqueraded source");
        assert!(checksums_valid(&out), "{what}: checksums after masquerade");
        let given = u16::from_be_bytes([out[34 + id_at], out[35 + id_at]]);
        assert!((1_024..=29_999).contains(&given), "{what}: port {given} is not of the range");
        let reply = match proto {
            6 => tcp(443, given, 0x12),
            _ => icmp_echo(0, given),
        };
        let back = from_uplink(&format!("{what}: reply"), from_ext(proto, &reply), TC_ACT_UNSPEC, None);
        assert_eq!(back[30..34], a.ip.octets(), "{what}: reply not translated back");
        let restored = if proto == 6 { 40001 } else { 0x1234 };
        let at = if proto == 6 { 36 } else { 38 };
        assert_eq!(back[at..at + 2], u16::to_be_bytes(restored), "{what}: reply's port");
        assert!(checksums_valid(&back), "{what}: checksums of the translated reply");
    }
    // An ICMP error quoting a masqueraded packet (fragmentation needed: path MTU discovery)
    // reaches the pod with the quoted packet translated back, every checksum right.
    let sent = to_uplink("UDP with a checksum", with_checksums(a_to(ext, &[], 0)), TC_ACT_UNSPEC, None);
    let icmp = [&[3, 4, 0, 0, 0, 0, 0x05, 0x78][..], &sent[14..]].concat();
    let error = from_ext(1, &icmp);
    let back = from_uplink("fragmentation needed", error, TC_ACT_UNSPEC, None);
    assert_eq!(back[30..34], a.ip.octets(), "ICMP error not sent on to the pod");
    assert!(checksums_valid(&back), "ICMP error's own checksums");
    let quoted = [&back[..14], &back[42..]].concat();
    assert_eq!(quoted[26..30], a.ip.octets(), "quoted source address");
    assert_eq!(quoted[34..36], 40000u16.to_be_bytes(), "quoted source port");
    assert!(checksums_valid(&quoted), "quoted packet's checksums");

    // A reply in fragments: the first by its ports, the later ones by their identification.
    let reply_first =
        [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, node_ip, UDP, &[], 0x2000, &udp(53, port, &[7; 64]))].concat();
    let back = from_uplink("reply's first fragment", reply_first, TC_ACT_UNSPEC, None);
    assert_eq!(back[30..34], a.ip.octets(), "reply's first fragment not translated");
    let reply_later = [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, node_ip, UDP, &[], 9, &[7; 64])].concat();
    let back = from_uplink("reply's later fragment", reply_later, TC_ACT_UNSPEC, None);
    assert_eq!(back[30..34], a.ip.octets(), "reply's later fragment not translated");
    assert!(checksum(&back[14..34]) == 0, "later fragment's header checksum");

    // A packet to the node on a port outside the range is the node's, whatever NAT holds.
    from_uplink("to a node port below the range", from_ext(UDP, &udp(53, 40000, b"?")), TC_ACT_UNSPEC, None);

    // Addresses of the node's pod subnet that are no pod never leave through the uplink.
    let unused: Ipv4Addr = "10.221.1.250".parse().unwrap();
    to_uplink("to an unused pod address", a_to(unused, &[], 0), TC_ACT_SHOT, Some(DropReason::NotAPod));
    let stray = [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, unused, UDP, &[], 0, &datagram)].concat();
    // Arriving, it is the stack's to route: back out of the uplink, where it is dropped.
    from_uplink("to an unused pod address", stray, TC_ACT_UNSPEC, None);

    // Another node's pod reaches a straight; the outside reaches it through the stack, which
    // hands it on into a (`to_pod` records the flow there, once netfilter let it through), and
    // a's reply keeps its own address.
    let other_pod: Ipv4Addr = "10.221.2.7".parse().unwrap();
    let to_a = |src: Ipv4Addr| [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(src, a.ip, UDP, &[], 0, &datagram)].concat();
    from_uplink("from another node's pod", to_a(other_pod), TC_ACT_REDIRECT, None);
    let client: Ipv4Addr = "192.0.2.77".parse().unwrap();
    from_uplink("from outside the cluster", to_a(client), TC_ACT_UNSPEC, None);
    let into_a = [ethernet(a.pod_mac, a.host_mac, ETH_IPV4), ipv4(client, a.ip, UDP, &[], 0, &datagram)].concat();
    let (verdict, _) = run_arrived(tb, "to_pod", &a.host_ifname, "uplink0", into_a);
    assert_eq!(verdict, TC_ACT_UNSPEC, "to_pod never drops");
    let answer = [from_a(ETH_IPV4), ipv4(a.ip, client, UDP, &[], 0, &udp(53, 40000, b"query"))].concat();
    let out = to_uplink("reply to the outside's flow", answer, TC_ACT_UNSPEC, None);
    assert_eq!(out[26..30], a.ip.octets(), "a reply in a flow opened from outside was masqueraded");

    // What the stack delivers into b from a cluster address (a Service's client, after DNAT)
    // makes b's replies in that flow take the stack too; b's other flows keep the fast path.
    let service_client = [ethernet(b.pod_mac, b.host_mac, ETH_IPV4), ipv4(a.ip, b.ip, UDP, &[], 0, &datagram)].concat();
    expect(tb, "to_pod", &b.host_ifname, "a Service's packet into b", service_client, TC_ACT_UNSPEC, None);
    let from_b = |l4: &[u8]| [ethernet(b.host_mac, b.pod_mac, ETH_IPV4), ipv4(b.ip, a.ip, UDP, &[], 0, l4)].concat();
    expect(tb, "from_pod", &b.host_ifname, "b's reply", from_b(&udp(53, 40000, b"r")), TC_ACT_UNSPEC, None);
    expect(tb, "from_pod", &b.host_ifname, "b's own flow", from_b(&udp(53, 40002, b"r")), TC_ACT_REDIRECT, None);
}

fn tcp(src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
    let mut h = [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &[0, 0, 0, 1, 0, 0, 0, 0]].concat();
    h.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

fn icmp_echo(kind: u8, id: u16) -> Vec<u8> {
    [&[kind, 0, 0, 0][..], &id.to_be_bytes(), &[0, 1], b"ping"].concat()
}

/// Recomputes only the IPv4 header checksum of an Ethernet frame (a later fragment has no L4
/// header to sum).
fn with_checksums_ip_only(mut frame: Vec<u8>) -> Vec<u8> {
    frame[24..26].fill(0);
    let sum = checksum(&frame[14..34]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    frame
}
