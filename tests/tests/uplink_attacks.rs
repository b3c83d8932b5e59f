//! Attacks from the LAN and from the outside on the stateful datapath (issue 24), as crafted
//! frames run through the pinned programs (`BPF_PROG_TEST_RUN`) of a live node:
//! - a forged packet from outside cannot take a pod's flow off masquerade (an ACK or RST
//!   records nothing; a SYN the stack passed cannot override an existing translation, nor a
//!   later flow the pod opens itself);
//! - a source of this node's pods arriving on the uplink is dropped (`SpoofedUplinkSource`);
//! - a SYN from the uplink forgets no Service flow's state;
//! - an outside RST marks a masqueraded flow closing only until the pod shows it alive, and an
//!   outside FIN (a half-close) marks nothing;
//! - an ICMP error quoting an IPv4 header shorter than 20 bytes is not translated;
//! - a later fragment finds no entry of a finished datagram, of one whose last fragment was lost
//!   (after the identification wraps), nor of another owner's.
use std::net::Ipv4Addr;

use ebpf_cni_tests::{
    Attached, Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed,
    frames::{ethernet, ipv4, tcp, with_checksums},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, expect, run_arrived},
};
use ebpf_common::{DropReason, FragmentEntry, FragmentKey};

const ETH_IPV4: u16 = 0x0800;
const TCP: u8 = 6;
const UDP: u8 = 17;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
const FIN: u8 = 0x01;

struct Node<'a> {
    tb: &'a Testbed,
    a: Attached,
    node_ip: Ipv4Addr,
}

impl Node<'_> {
    /// A packet of pod a's on its way out of the uplink (after the stack routed it).
    fn a_sends(&self, what: &str, dst: Ipv4Addr, l4: &[u8], proto: u8) -> Vec<u8> {
        let frame = with_checksums([ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(self.a.ip, dst, proto, l4)].concat());
        expect(self.tb, "to_uplink", "uplink0", what, frame, TC_ACT_UNSPEC, None)
    }

    /// The source address a's packet leaves with.
    fn leaves_as(&self, what: &str, dst: Ipv4Addr, l4: &[u8]) -> Ipv4Addr {
        let out = self.a_sends(what, dst, l4, TCP);
        Ipv4Addr::new(out[26], out[27], out[28], out[29])
    }

    /// A frame from the LAN through `from_uplink`.
    fn arrives(&self, what: &str, src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8], verdict: u32) -> Vec<u8> {
        let frame = with_checksums([ethernet([4; 6], [2; 6], ETH_IPV4), ipv4(src, dst, proto, l4)].concat());
        let reason = (verdict == TC_ACT_SHOT).then_some(DropReason::SpoofedUplinkSource);
        expect(self.tb, "from_uplink", "uplink0", what, frame, verdict, reason)
    }

    /// A frame from outside that the node's stack accepted and hands into pod a (`to_pod`).
    fn stack_delivers_to_a(&self, src: Ipv4Addr, l4: &[u8]) {
        let frame = with_checksums(
            [ethernet(self.a.pod_mac, self.a.host_mac, ETH_IPV4), ipv4(src, self.a.ip, TCP, l4)].concat(),
        );
        let (verdict, _) = run_arrived(self.tb, "to_pod", &self.a.host_ifname, "uplink0", frame);
        assert_eq!(verdict, TC_ACT_UNSPEC, "to_pod never drops");
    }

    /// `closing` of the reply entry of a's masqueraded TCP flow from `port` to `ext`:443.
    fn closing(&self, port: u16) -> u64 {
        let dump = self.tb.map_dump("NAT").unwrap();
        let entry = dump
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.get("formatted").unwrap_or(e))
            .find(|e| e["key"]["protocol"] == 6 && e["key"]["src_port"] == 443 && e["key"]["dst_port"] == port)
            .unwrap_or_else(|| panic!("no reply entry for port {port}"))
            .clone();
        entry["value"]["closing"].as_u64().unwrap()
    }
}

/// A two-node cluster (`10.<octet>.0.0/16`) whose first node has `pods` pods attached.
fn cluster_with_pods(test: &str, tag: &str, octet: u8, pods: usize) -> Option<(Cluster, Vec<Attached>)> {
    let (cidr, subnets) = (format!("10.{octet}.0.0/16"), [format!("10.{octet}.1.0/24"), format!("10.{octet}.2.0/24")]);
    let mut c = Cluster::for_test(test, tag, &cidr, [subnets[0].as_str(), subnets[1].as_str()])?;
    let attached = c.nodes[0].add_attachments(pods).unwrap();
    Some((c, attached))
}

impl<'a> Node<'a> {
    fn new(tb: &'a Testbed, a: Attached) -> Self {
        Self { tb, a, node_ip: NODE1_UPLINK_IP.parse().unwrap() }
    }
}

fn port_of(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[34], frame[35]])
}

#[test]
fn forged_packets_from_outside_change_no_flow_state() {
    let Some((c, mut pods)) = cluster_with_pods("forged_packets_from_outside_change_no_flow_state", "forge", 223, 2)
    else {
        return;
    };
    let b = pods.pop().unwrap();
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let node = Node::new(&c.nodes[0], pods.pop().unwrap());
    let a_ip = node.a.ip;

    // 1. a's established masqueraded connection; the attacker forges the server's ACK and RST
    //    to a's own address and port (what the flow would use unmasqueraded), then a SYN the
    //    stack lets through: a's next segments still leave masqueraded.
    let syn = node.a_sends("a's SYN", ext, &tcp(40001, 443, SYN), TCP);
    assert_eq!(syn[26..30], node.node_ip.octets(), "a's SYN masqueraded");
    for (what, flags) in [("ACK", ACK), ("RST", RST | ACK), ("SYN", SYN)] {
        node.arrives(&format!("forged {what} to a"), ext, a_ip, TCP, &tcp(443, 40001, flags), TC_ACT_UNSPEC);
        node.stack_delivers_to_a(ext, &tcp(443, 40001, flags));
        let source = node.leaves_as(&format!("a's ACK after a forged {what}"), ext, &tcp(40001, 443, ACK));
        assert_eq!(source, node.node_ip, "a forged {what} took a's established flow off masquerade");
    }

    // 2. A SYN for a 5-tuple a has not used yet, passed by the stack: a's own SYN on it later
    //    opens a masqueraded flow of its own, and its segments after it stay masqueraded.
    node.stack_delivers_to_a(ext, &tcp(443, 40002, SYN));
    assert_eq!(node.leaves_as("a's SYN on a pre-planted 5-tuple", ext, &tcp(40002, 443, SYN)), node.node_ip);
    assert_eq!(node.leaves_as("a's ACK on that flow", ext, &tcp(40002, 443, ACK)), node.node_ip);

    // 3. What stays: a flow the outside opens to a's address (a SYN the stack passed) is
    //    answered from a's address, once a's SYN-ACK confirmed it; an ACK the stack passed
    //    opens none; a record a's SYN-ACK never confirmed (a planted SYN, its flow's own
    //    translation gone) does not take a's segments off masquerade.
    node.stack_delivers_to_a(ext, &tcp(443, 40003, SYN));
    assert_eq!(node.leaves_as("a's SYN-ACK to the outside's SYN", ext, &tcp(40003, 443, SYN | ACK)), a_ip);
    assert_eq!(node.leaves_as("a's next segment in that flow", ext, &tcp(40003, 443, ACK)), a_ip);
    node.stack_delivers_to_a(ext, &tcp(443, 40004, ACK));
    assert_eq!(node.leaves_as("a's answer to a lone ACK", ext, &tcp(40004, 443, ACK)), node.node_ip);
    node.stack_delivers_to_a(ext, &tcp(443, 40005, SYN));
    assert_eq!(node.leaves_as("a's ACK on an unconfirmed record", ext, &tcp(40005, 443, ACK)), node.node_ip);
    // UDP: a datagram the stack passed is answered from a's address only by a's answer within
    // the confirmation window; a's first datagram later on that 5-tuple is a flow of its own.
    let udp_to_a =
        |sport: u16, dport: u16| [&sport.to_be_bytes()[..], &dport.to_be_bytes(), &[0, 9, 0, 0, b'q']].concat();
    let deliver_udp = |l4: &[u8]| {
        let frame =
            with_checksums([ethernet(node.a.pod_mac, node.a.host_mac, ETH_IPV4), ipv4(ext, a_ip, UDP, l4)].concat());
        run_arrived(node.tb, "to_pod", &node.a.host_ifname, "uplink0", frame);
    };
    let udp_source = |what: &str, l4: &[u8]| {
        let out = node.a_sends(what, ext, l4, UDP);
        Ipv4Addr::new(out[26], out[27], out[28], out[29])
    };
    deliver_udp(&udp_to_a(53, 40006));
    assert_eq!(udp_source("a's prompt answer to a datagram", &udp_to_a(40006, 53)), a_ip);
    deliver_udp(&udp_to_a(53, 40007));
    std::thread::sleep(std::time::Duration::from_millis(3_200));
    assert_eq!(udp_source("a's own datagram long after a planted one", &udp_to_a(40007, 53)), node.node_ip);
    assert_eq!(udp_source("a's answer, still confirmed", &udp_to_a(40006, 53)), a_ip);

    // 4. Sources of this node's pods arriving from the LAN: dropped, counted.
    node.arrives("from pod b's address", b.ip, a_ip, UDP, &[0; 8], TC_ACT_SHOT);
    node.arrives("from pod b's address to the node", b.ip, node.node_ip, UDP, &[0; 8], TC_ACT_SHOT);
    node.arrives(
        "from an unused address of the pod subnet",
        "10.223.1.250".parse().unwrap(),
        a_ip,
        UDP,
        &[0; 8],
        TC_ACT_SHOT,
    );
    node.arrives("from another node's pod", "10.223.2.9".parse().unwrap(), a_ip, UDP, &[0; 8], TC_ACT_REDIRECT);

    // 5. A SYN from the uplink forgets nothing. a reaches a Service whose endpoint is another
    //    node's pod: the stack sent it (kube-proxy's DNAT), so its replies must take the stack.
    //    A forged SYN with the endpoint's address and that 5-tuple does not clear that.
    let endpoint: Ipv4Addr = "10.223.2.7".parse().unwrap();
    node.a_sends("a to a Service's remote endpoint, through the stack", endpoint, &tcp(40010, 8080, SYN), TCP);
    node.arrives("the endpoint's reply", endpoint, a_ip, TCP, &tcp(8080, 40010, SYN | ACK), TC_ACT_UNSPEC);
    node.arrives("a forged SYN on the Service flow", endpoint, a_ip, TCP, &tcp(8080, 40010, SYN), TC_ACT_UNSPEC);
    node.arrives("the endpoint's next segment", endpoint, a_ip, TCP, &tcp(8080, 40010, ACK), TC_ACT_UNSPEC);

    // 6. And a SYN from the uplink on a 5-tuple whose other way is recorded (a's replies to a
    //    flow the stack delivered: hostPort, a NodePort's local endpoint) goes through the stack
    //    too, so that conntrack sees the new connection both ways.
    let remote: Ipv4Addr = "10.223.2.8".parse().unwrap();
    let into_a = with_checksums(
        [ethernet(node.a.pod_mac, node.a.host_mac, ETH_IPV4), ipv4(remote, a_ip, TCP, &tcp(5555, 8080, SYN))].concat(),
    );
    run_arrived(node.tb, "to_pod", &node.a.host_ifname, "uplink0", into_a);
    node.arrives("a direct SYN on that 5-tuple", remote, a_ip, TCP, &tcp(5555, 8080, SYN), TC_ACT_UNSPEC);
}

#[test]
fn outside_resets_and_half_closes_do_not_end_a_masqueraded_flow() {
    let Some((c, mut pods)) =
        cluster_with_pods("outside_resets_and_half_closes_do_not_end_a_masqueraded_flow", "rst", 224, 1)
    else {
        return;
    };
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let node = Node::new(&c.nodes[0], pods.pop().unwrap());

    let port = port_of(&node.a_sends("a's SYN", ext, &tcp(40001, 443, SYN), TCP));
    assert_eq!(node.closing(port), 0);
    let to_node = |flags| tcp(443, port, flags);
    node.arrives("the server's FIN (half-close)", ext, node.node_ip, TCP, &to_node(FIN | ACK), TC_ACT_UNSPEC);
    assert_eq!(node.closing(port), 0, "an outside FIN marked the flow closing");
    // A RST sprayed at the node's ports marks nothing where it arrives (before netfilter)...
    node.arrives("a forged RST", ext, node.node_ip, TCP, &to_node(RST), TC_ACT_UNSPEC);
    assert_eq!(node.closing(port), 0, "a RST marked the flow closing before the stack accepted it");
    // ...only once the stack accepted it and hands it into a (translated back).
    node.stack_delivers_to_a(ext, &tcp(443, 40001, RST));
    assert_eq!(node.closing(port), 2, "an accepted outside RST marks the flow closing until a's next packet");
    node.a_sends("a's next segment", ext, &tcp(40001, 443, ACK), TCP);
    assert_eq!(node.closing(port), 0, "a's segment after the RST did not take the mark back");
    node.a_sends("a's FIN", ext, &tcp(40001, 443, FIN | ACK), TCP);
    node.a_sends("a's last ACK", ext, &tcp(40001, 443, ACK), TCP);
    assert_eq!(node.closing(port), 1, "a's own FIN marks the flow closing for good");
}

#[test]
fn icmp_errors_quoting_a_short_ipv4_header_are_not_translated() {
    let Some((c, mut pods)) =
        cluster_with_pods("icmp_errors_quoting_a_short_ipv4_header_are_not_translated", "ihl", 225, 1)
    else {
        return;
    };
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let node = Node::new(&c.nodes[0], pods.pop().unwrap());
    // With IHL 0 the quoted "ports" are the quoted header's first bytes: 0x40 and its TOS, and
    // its total length. A flow whose masquerade port is 0x40xx, to port `total length`, is one
    // an attacker can name that way: find one among a's flows to port 28.
    let port = (1..4_000u16)
        .map(|i| {
            port_of(&node.a_sends(
                "a's datagram",
                ext,
                &[&(20_000 + i).to_be_bytes()[..], &[0, 28, 0, 8, 0, 0]].concat(),
                UDP,
            ))
        })
        .find(|port| port >> 8 == 0x40)
        .expect("no masquerade port of 0x4000-0x40ff in 4,000 flows");
    for (ihl, translated) in [(5u8, true), (0, false)] {
        // The header a's datagram left with, as the error quotes it.
        let mut quoted = ipv4(node.node_ip, ext, UDP, &[&port.to_be_bytes()[..], &[0, 28, 0, 8, 0, 0]].concat());
        quoted[0] = 0x40 | ihl;
        quoted[1] = port as u8;
        let icmp = [&[3, 3, 0, 0, 0, 0, 0, 0][..], &quoted].concat();
        let what = format!("port unreachable quoting IHL {ihl}");
        let back = node.arrives(&what, ext, node.node_ip, 1, &icmp, TC_ACT_UNSPEC);
        let to_pod = back[30..34] == node.a.ip.octets();
        assert_eq!(to_pod, translated, "IHL {ihl}: translated {to_pod}");
    }
}

/// `frame` as a fragment: IPv4 identification `id`, flags and offset `frags` (checksums redone).
fn fragment(mut frame: Vec<u8>, id: u16, frags: u16) -> Vec<u8> {
    frame[18..20].copy_from_slice(&id.to_be_bytes());
    frame[20..22].copy_from_slice(&frags.to_be_bytes());
    with_checksums(frame)
}

#[test]
fn a_reused_fragment_id_finds_no_old_datagram() {
    let Some((c, mut pods)) = cluster_with_pods("a_reused_fragment_id_finds_no_old_datagram", "frag", 226, 1) else {
        return;
    };
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let node = Node::new(&c.nodes[0], pods.pop().unwrap());
    let datagram = [&40000u16.to_be_bytes()[..], &53u16.to_be_bytes(), &[0, 72, 0, 0], &[7; 64]].concat();
    let out = |frame: Vec<u8>| [ethernet([2; 6], [4; 6], ETH_IPV4), frame].concat();
    let a_to_ext = |l4: &[u8]| out(ipv4(node.a.ip, ext, UDP, l4));
    let to_uplink = |what: &str, frame: Vec<u8>, verdict: u32, reason: Option<DropReason>| {
        expect(node.tb, "to_uplink", "uplink0", what, frame, verdict, reason)
    };

    // Out: a's datagram 0x4242 in two fragments; the last one ends it.
    let first = to_uplink("first fragment", fragment(a_to_ext(&datagram), 0x4242, 0x2000), TC_ACT_UNSPEC, None);
    let port = port_of(&first);
    to_uplink("last fragment", fragment(a_to_ext(&[7; 16]), 0x4242, 9), TC_ACT_UNSPEC, None);
    // 65,536 datagrams later the identification comes round: a fragment of the new datagram that
    // arrives before its first is not sent with the old one's translation.
    let reused = fragment(a_to_ext(&[7; 16]), 0x4242, 9);
    to_uplink("a later fragment reusing the id", reused, TC_ACT_SHOT, Some(DropReason::NatUntranslatable));

    // In: the reply in two fragments reaches a; a later datagram with the same identification
    // whose first fragment has not come is left to the node, not handed to a.
    let to_node = |l4: &[u8]| [ethernet([4; 6], [2; 6], ETH_IPV4), ipv4(ext, node.node_ip, UDP, l4)].concat();
    let reply = [&53u16.to_be_bytes()[..], &port.to_be_bytes(), &[0, 72, 0, 0], &[7; 64]].concat();
    let from_uplink =
        |what: &str, frame: Vec<u8>| expect(node.tb, "from_uplink", "uplink0", what, frame, TC_ACT_UNSPEC, None);
    let back = from_uplink("reply's first fragment", fragment(to_node(&reply), 0x5151, 0x2000));
    assert_eq!(back[30..34], node.a.ip.octets(), "reply's first fragment reaches a");
    let back = from_uplink("reply's last fragment", fragment(to_node(&[7; 16]), 0x5151, 9));
    assert_eq!(back[30..34], node.a.ip.octets(), "reply's last fragment reaches a");
    let back = from_uplink("a later fragment reusing the id", fragment(to_node(&[7; 16]), 0x5151, 9));
    assert_eq!(back[30..34], node.node_ip.octets(), "a fragment of another datagram went to a");

    // A datagram whose last fragment is lost: its entry lapses. Once the identification has come
    // round (here: after `FRAGMENT_TIMEOUT_NS`), a later fragment of a new datagram that arrives
    // before its own first is left to the node, not handed to a with the lost datagram's address.
    let back = from_uplink("a lost datagram's first fragment", fragment(to_node(&reply), 0x6161, 0x2000));
    assert_eq!(back[30..34], node.a.ip.octets(), "first fragment reaches a");
    let back = from_uplink("its middle fragment", fragment(to_node(&[7; 16]), 0x6161, 0x2000 | 9));
    assert_eq!(back[30..34], node.a.ip.octets(), "a middle fragment within the timeout reaches a");
    std::thread::sleep(std::time::Duration::from_nanos(ebpf_common::FRAGMENT_TIMEOUT_NS + 200_000_000));
    let back = from_uplink("a fragment after the id wrapped", fragment(to_node(&[7; 16]), 0x6161, 0x2000 | 12));
    assert_eq!(back[30..34], node.node_ip.octets(), "a fragment found a lapsed datagram's entry");

    // An entry is good only for the pod whose flow it is: one whose owner no longer holds the
    // address (a deleted pod's, its address given again) sends nothing to the address.
    let back = from_uplink("another datagram's first fragment", fragment(to_node(&reply), 0x7171, 0x2000));
    assert_eq!(back[30..34], node.a.ip.octets(), "first fragment reaches a");
    let mut fragments = fragment_map(node.tb);
    let (key, mut entry) = fragments.iter().filter_map(Result::ok).find(|(k, _)| k.id == 0x7171).expect("its entry");
    entry.owner ^= 1;
    fragments.insert(key, entry, 0).unwrap();
    let back = from_uplink("a fragment of another owner's datagram", fragment(to_node(&[7; 16]), 0x7171, 9));
    assert_eq!(back[30..34], node.node_ip.octets(), "a fragment went to the address of a gone owner's flow");
}

fn fragment_map(tb: &Testbed) -> aya::maps::HashMap<aya::maps::MapData, FragmentKey, FragmentEntry> {
    let data = aya::maps::MapData::from_pin(tb.map_pin("FRAGMENTS")).unwrap();
    aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).unwrap()).unwrap()
}
