//! The programs themselves, run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): the
//! pinned programs of a real node with two pods, each frame given as if it arrived on a pod's
//! host veth (or the uplink). Every odd frame gets the documented verdict and drop reason.
use std::{ffi::CString, net::Ipv4Addr};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use ebpf_cni_tests::{Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed, traffic::in_netns};
use ebpf_common::DropReason;

const TC_ACT_UNSPEC: u32 = u32::MAX; // -1: leave it to the next filter and the stack
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
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

/// Runs the pinned program `name` on `frame` as if it arrived on `ifname` of the node; returns
/// the verdict and the frame as the program left it.
fn run(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>) -> (u32, Vec<u8>) {
    try_run(tb, name, ifname, frame).unwrap()
}

fn try_run(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>) -> anyhow::Result<(u32, Vec<u8>)> {
    let pin = tb.version_dir().join("progs").join(name);
    let ifname = CString::new(ifname).unwrap();
    in_netns(&tb.node.name, move || {
        // The device is looked up in the caller's namespace: the node's.
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
        anyhow::ensure!(ifindex > 0, "no interface {ifname:?}");
        // `struct __sk_buff` up to and including `ifindex` (offset 40); the rest stays zero.
        let mut ctx = [0u8; 44];
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        let program = SchedClassifier::from_pin(&pin)?;
        let mut out = vec![0u8; frame.len() + 64];
        let result = program.test_run(TestRunOptions {
            data_in: Some(&frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })?;
        out.truncate(result.data_size_out as usize);
        Ok((result.return_value, out))
    })
}

/// Asserts the verdict of `frame` and, for a drop, that its reason was counted once.
fn expect(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    what: &str,
    frame: Vec<u8>,
    verdict: u32,
    reason: Option<DropReason>,
) -> Vec<u8> {
    let before = reason.map(|r| tb.drops(r).unwrap());
    let (got, out) = run(tb, name, ifname, frame);
    assert_eq!(got, verdict, "{name}: {what}: verdict {got:#x}, expected {verdict:#x}");
    if let (Some(reason), Some(before)) = (reason, before) {
        let after = tb.drops(reason).unwrap();
        // The pods' kernels add `UnsupportedProtocol` drops of their own (IPv6 router
        // solicitations) at any moment: for that reason, at least one more is all a test can ask.
        let counted = if reason == DropReason::UnsupportedProtocol { after > before } else { after == before + 1 };
        assert!(counted, "{name}: {what}: {reason:?} not counted ({before} before, {after} after)");
    }
    out
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
    let out = to_uplink("UDP with IP options", a_to(ext, &[1, 1, 1, 1], 0), TC_ACT_UNSPEC, None);
    assert_eq!(out[26..30], node_ip.octets(), "masqueraded source");
    to_uplink("fragment", a_to(ext, &[], 0x2000), TC_ACT_SHOT, Some(DropReason::NatUntranslatable));
    let gre = [from_a(ETH_IPV4), ipv4(a.ip, ext, 47, &[], 0, &[0; 8])].concat();
    to_uplink("GRE", gre, TC_ACT_SHOT, Some(DropReason::NatUntranslatable));
    let short_udp = [from_a(ETH_IPV4), ipv4(a.ip, ext, UDP, &[], 0, &[0; 4])].concat();
    to_uplink("UDP header cut at 4 bytes", short_udp, TC_ACT_SHOT, Some(DropReason::Malformed));
    to_uplink("IPv6", [from_a(0x86dd), vec![0x60; 40]].concat(), TC_ACT_UNSPEC, None);

    // The reply to the UDP flow above goes straight into pod a; anything else to the node
    // continues into it.
    let port = u16::from_be_bytes([out[34 + 4], out[34 + 5]]);
    let reply =
        [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, node_ip, UDP, &[], 0, &udp(53, port, b"answer"))].concat();
    let delivered = expect(tb, "from_uplink", "uplink0", "reply", reply, TC_ACT_REDIRECT, None);
    assert_eq!(delivered[30..34], a.ip.octets(), "reply not translated back to the pod");
    assert_eq!(delivered[..6], a.pod_mac, "reply not addressed to the pod");
    let stranger = [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(ext, node_ip, UDP, &[], 0, &udp(53, 1, b"?"))].concat();
    expect(tb, "from_uplink", "uplink0", "no flow", stranger, TC_ACT_UNSPEC, None);
}
