//! IPv6 on the uplink, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`) through the
//! pinned `to_uplink6` and `from_uplink6` of a dual-stack node: masquerade of TCP, UDP and
//! ICMPv6 echo both ways with every checksum right (the IPv6 pseudo-header), ICMPv6 errors
//! (packet too big) translated back quote and all, flows opened from outside kept unmasqueraded,
//! addresses of the node's IPv6 pod subnet that are no pod kept in, and which way a flow goes:
//! the FIB fast path to another node's pod, flows the stack handled kept on the stack.
use std::net::Ipv6Addr;

use ebpf_cni_tests::{
    Cluster, EXT_SERVER_V6, EXT_UPLINK_IPV6, NODE1_UPLINK_IPV6,
    frames::{ethernet, ipv6, ipv6_checksum_valid},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, expect, run_arrived, run_checksum_complete},
    run_in,
};
use ebpf_common::DropReason;
use serde_json::Value;

const ETH_IPV6: u16 = 0x86dd;
const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMPV6: u8 = 58;
/// Where things are in an Ethernet + IPv6 frame.
const SRC: std::ops::Range<usize> = 22..38;
const DST: std::ops::Range<usize> = 38..54;
const L4: usize = 54;

fn udp(src_port: u16, dst_port: u16, body: &[u8]) -> Vec<u8> {
    let len = (8 + body.len()) as u16;
    [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &len.to_be_bytes(), &[0, 0], body].concat()
}

fn tcp(src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
    let head = [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &[0, 0, 0, 1, 0, 0, 0, 0]].concat();
    [head, vec![0x50, flags, 0xff, 0xff, 0, 0, 0, 0]].concat()
}

fn echo(kind: u8, id: u16) -> Vec<u8> {
    [&[kind, 0, 0, 0][..], &id.to_be_bytes(), &[0, 1], b"ping"].concat()
}

fn port_at(frame: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([frame[L4 + at], frame[L4 + at + 1]])
}

#[test]
fn ipv6_on_the_uplink_gets_its_documented_translations() {
    let Some(mut c) = Cluster::for_test(
        "ipv6_on_the_uplink_gets_its_documented_translations",
        "craft6",
        "10.222.0.0/16",
        ["10.222.1.0/24", "10.222.2.0/24"],
    ) else {
        return;
    };
    c.add_ipv6("fd00:10:222::/56", ["fd00:10:222:1::/64", "fd00:10:222:2::/64"]).unwrap();
    let tb = &mut c.nodes[0];
    let pod = tb.new_pod().unwrap();
    let out = tb.cni("ADD", pod, &tb.conf("1.0.0")).unwrap();
    assert!(out.success, "ADD: {} {}", out.stdout, out.stderr);
    let result: Value = out.json();
    let a: Ipv6Addr = result["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap();
    let node: Ipv6Addr = NODE1_UPLINK_IPV6.parse().unwrap();
    let ext: Ipv6Addr = EXT_SERVER_V6.parse().unwrap();
    let frame = |src: Ipv6Addr, dst: Ipv6Addr, next: u8, l4: &[u8]| {
        [ethernet([2; 6], [4; 6], ETH_IPV6), ipv6(src, dst, next, l4)].concat()
    };
    let to_uplink = |what: &str, frame: Vec<u8>, verdict: u32, reason: Option<DropReason>| {
        expect(tb, "to_uplink6", "uplink0", what, frame, verdict, reason)
    };
    let from_uplink =
        |what: &str, frame: Vec<u8>, verdict: u32| expect(tb, "from_uplink6", "uplink0", what, frame, verdict, None);

    // UDP, TCP and echo out with the node's address and a port of the range; replies back.
    for (what, next, l4, port_offset, reply) in [
        ("UDP", UDP, udp(40000, 53, b"query"), 0, udp(53, 0, b"answer")),
        ("TCP SYN", TCP, tcp(40001, 443, 0x02), 0, tcp(443, 0, 0x12)),
        ("echo request", ICMPV6, echo(128, 0x1234), 4, echo(129, 0)),
    ] {
        let out = to_uplink(what, frame(a, ext, next, &l4), TC_ACT_UNSPEC, None);
        assert_eq!(out[SRC], node.octets(), "{what}: masqueraded source");
        assert!(ipv6_checksum_valid(&out[14..]), "{what}: checksum after masquerade");
        let given = port_at(&out, port_offset);
        assert!((1_024..=29_999).contains(&given), "{what}: port {given} is not of the range");
        let mut reply = reply.clone();
        let reply_port_at = if next == ICMPV6 { 4 } else { 2 };
        reply[reply_port_at..reply_port_at + 2].copy_from_slice(&given.to_be_bytes());
        let back = from_uplink(&format!("{what}: reply"), frame(ext, node, next, &reply), TC_ACT_UNSPEC);
        assert_eq!(back[DST], a.octets(), "{what}: reply not translated back");
        let restored = port_at(&back, reply_port_at);
        assert_eq!(restored, port_at(&frame(a, ext, next, &l4), port_offset), "{what}: reply's port");
        assert!(ipv6_checksum_valid(&back[14..]), "{what}: checksum of the translated reply");
    }

    // From a NIC that reports CHECKSUM_COMPLETE (`skb->csum`, the sum of the whole packet): the
    // translation leaves it right both ways, or the stack would drop the packet as corrupt.
    for (what, next, l4) in [("UDP", UDP, udp(41000, 53, b"query")), ("TCP", TCP, tcp(41001, 443, 0x02))] {
        let out = run_checksum_complete(tb, "to_uplink6", "uplink0", frame(a, ext, next, &l4))
            .unwrap_or_else(|e| panic!("{what} out, CHECKSUM_COMPLETE: {e}"));
        assert_eq!(out.1[SRC], node.octets(), "{what}: masqueraded");
        let mut reply = if next == UDP { udp(53, 0, b"answer") } else { tcp(443, 0, 0x12) };
        reply[2..4].copy_from_slice(&port_at(&out.1, 0).to_be_bytes());
        let back = run_checksum_complete(tb, "from_uplink6", "uplink0", frame(ext, node, next, &reply))
            .unwrap_or_else(|e| panic!("{what} reply, CHECKSUM_COMPLETE: {e}"));
        assert_eq!(back.1[DST], a.octets(), "{what}: reply translated back");
    }

    // Packet too big, quoting the masqueraded UDP datagram: back to the pod, quote translated,
    // the ICMPv6 checksum and the quoted UDP checksum right.
    let sent = to_uplink("UDP again", frame(a, ext, UDP, &udp(40000, 53, b"query")), TC_ACT_UNSPEC, None);
    let too_big = [&[2, 0, 0, 0, 0, 0, 0x05, 0x00][..], &sent[14..]].concat();
    let back = from_uplink("packet too big", frame(ext, node, ICMPV6, &too_big), TC_ACT_UNSPEC);
    assert_eq!(back[DST], a.octets(), "ICMPv6 error not sent on to the pod");
    assert!(ipv6_checksum_valid(&back[14..]), "ICMPv6 error's checksum");
    let quoted = &back[L4 + 8..];
    assert_eq!(quoted[8..24], a.octets(), "quoted source address");
    assert_eq!(quoted[40..42], 40000u16.to_be_bytes(), "quoted source port");
    assert!(ipv6_checksum_valid(quoted), "quoted datagram's checksum");

    // To the node on a port outside the range: the node's.
    let node_own = from_uplink("to a node port", frame(ext, node, UDP, &udp(53, 40000, b"?")), TC_ACT_UNSPEC);
    assert_eq!(node_own[DST], node.octets(), "left to the node");

    // From outside to the pod: through the stack, which hands it into the pod (`to_pod` records
    // the flow there), and the pod's reply keeps its address. A source of this node's pods
    // from the LAN is forged: dropped.
    let client: Ipv6Addr = "fd00:192:0:2::77".parse().unwrap();
    from_uplink("from outside the cluster", frame(client, a, UDP, &udp(5000, 8080, b"hi")), TC_ACT_UNSPEC);
    let host_veth = result["interfaces"][0]["name"].as_str().unwrap().to_string();
    let (verdict, _) = run_arrived(tb, "to_pod", &host_veth, "uplink0", frame(client, a, UDP, &udp(5000, 8080, b"hi")));
    assert_eq!(verdict, TC_ACT_UNSPEC, "to_pod never drops");
    let forged = frame(a, a, UDP, &udp(5000, 8080, b"hi"));
    expect(
        tb,
        "from_uplink6",
        "uplink0",
        "from the pod's own address",
        forged,
        TC_ACT_SHOT,
        Some(DropReason::SpoofedUplinkSource),
    );
    let forged = frame("fd00:10:222:1::fb".parse().unwrap(), a, UDP, &udp(5000, 8080, b"hi"));
    expect(
        tb,
        "from_uplink6",
        "uplink0",
        "from the pod subnet",
        forged,
        TC_ACT_SHOT,
        Some(DropReason::SpoofedUplinkSource),
    );
    // A LAN host whose link-local address is a pod's (a pod may ask for a MAC whose EUI-64 it
    // is) is not cut off: link-local entries vouch for the pod's own link only.
    assert!(result["interfaces"][1]["sandbox"].is_string(), "interface 1 is the pod's");
    let mac: Vec<u8> = result["interfaces"][1]["mac"]
        .as_str()
        .unwrap()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let link_local =
        Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]]);
    let router_solicitation = frame(link_local, "ff02::2".parse().unwrap(), ICMPV6, &[133, 0, 0, 0, 0, 0, 0, 0]);
    from_uplink("from a LAN host with a pod's link-local address", router_solicitation, TC_ACT_UNSPEC);
    let answer = to_uplink("the pod's answer", frame(a, client, UDP, &udp(8080, 5000, b"ho")), TC_ACT_UNSPEC, None);
    assert_eq!(answer[SRC], a.octets(), "a reply in a flow opened from outside was masqueraded");

    // An address of the node's IPv6 pod subnet that is no pod never leaves.
    let unused: Ipv6Addr = "fd00:10:222:1::fa".parse().unwrap();
    to_uplink(
        "to an unused pod address",
        frame(a, unused, UDP, &udp(1, 2, b"x")),
        TC_ACT_SHOT,
        Some(DropReason::NotAPod),
    );
    // Extension headers (a fragment header here) cannot be translated: dropped, not leaked.
    let fragment = [&[17, 0, 0, 1, 0, 0, 0, 9][..], &udp(40000, 53, b"x")].concat();
    let mut fragmented = frame(a, ext, 44, &[0; 4]);
    fragmented.truncate(L4);
    fragmented[18..20].copy_from_slice(&(fragment.len() as u16).to_be_bytes());
    fragmented.extend_from_slice(&fragment);
    to_uplink("a fragment", fragmented, TC_ACT_SHOT, Some(DropReason::NatUntranslatable));

    // Which way a flow goes, as for IPv4 (`steer.rs`). Another node's pod behind the uplink: a
    // route to its subnet via the router, whose MAC the node knows.
    let n1 = tb.node.name.clone();
    run_in(&n1, "ip", &["-6", "route", "add", "fd00:10:222:9::/64", "via", EXT_UPLINK_IPV6]).unwrap();
    run_in(&n1, "ping", &["-6", "-c", "1", "-W", "2", EXT_UPLINK_IPV6]).unwrap();
    let remote: Ipv6Addr = "fd00:10:222:9::5".parse().unwrap();
    let from_pod =
        |what: &str, frame: Vec<u8>, verdict: u32| expect(tb, "from_pod", &host_veth, what, frame, verdict, None);
    let out = from_pod("to another node's pod", frame(a, remote, UDP, &udp(7000, 7001, b"x")), TC_ACT_REDIRECT);
    assert_eq!(out[21], 63, "hop limit decremented, as a router does");
    // A flow the stack sent to another node (a Service's remote endpoint) is recorded: its
    // replies from the uplink take the stack; the pod's other flows come straight in.
    to_uplink("through the stack to another node", frame(a, remote, UDP, &udp(7002, 53, b"q")), TC_ACT_UNSPEC, None);
    from_uplink("its reply", frame(remote, a, UDP, &udp(53, 7002, b"r")), TC_ACT_UNSPEC);
    let other = frame(remote, a, UDP, &udp(53, 7003, b"r"));
    expect(tb, "from_uplink6", "uplink0", "another flow of that node's pod", other, TC_ACT_REDIRECT, None);
    // A packet the stack delivers into the pod from a cluster address (a Service's client after
    // DNAT): the pod's reply in that flow takes the stack, its other flows the fast path.
    let client: Ipv6Addr = "fd00:10:222:9::6".parse().unwrap();
    let into_pod = frame(client, a, UDP, &udp(5000, 8080, b"hi"));
    expect(tb, "to_pod", &host_veth, "a Service's packet into the pod", into_pod, TC_ACT_UNSPEC, None);
    from_pod("the pod's reply", frame(a, client, UDP, &udp(8080, 5000, b"ho")), TC_ACT_UNSPEC);
    from_pod("the pod's own flow", frame(a, client, UDP, &udp(8081, 5000, b"ho")), TC_ACT_REDIRECT);
}
