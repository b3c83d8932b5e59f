//! Attacks on NetworkPolicy enforcement, performed in real namespaces: each test is one way a
//! pod, a LAN host or a forged packet might get past a policy that denies it. The maps are
//! written straight from the test, as the agent would (`policy_datapath.rs` does the same).
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    path::Path,
};

use aya::maps::{
    Array, HashMap, Map, MapData,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_cni_tests::{
    NODE_IP, Testbed,
    frames::{self, ethernet},
    lan::{Ipv6Plan, LAN_HOST, LAN_HOST_V6, LAN_NODE_IPV6S, Lan, link_mac},
    policy_maps::{pod_object_in, policy_set},
    probe::{self, Servers},
    run_in,
    traffic::PacketSocket,
};
use ebpf_common::{
    Endpoint, IDENTITY_HOST, IDENTITY_WORLD, IpKey, POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED,
    POLICY_INGRESS_ISOLATED, POLICY_RULE_FULL_BITS, PolicyEndpoint, PolicyIdentity, PolicyRule, PolicyRuleKey,
    host_veth_slot, identity_prefix_len, names,
};
use serde_json::{Value, json};

const TCP: u8 = 6;
const A: u32 = 256;
const B: u32 = 257;

/// The pinned policy maps of one node, written as the agent writes them.
struct Policy {
    identities: LpmTrie<MapData, IpKey, PolicyIdentity>,
    subjects: Array<MapData, PolicyEndpoint>,
    rules: LpmTrie<MapData, PolicyRuleKey, PolicyRule>,
    endpoints: HashMap<MapData, IpKey, Endpoint>,
}

fn open(tb: &Testbed, name: &str) -> Map {
    let pin = tb.map_pin(name);
    Map::from_map_data(MapData::from_pin(Path::new(&pin)).unwrap()).unwrap()
}

fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

impl Policy {
    fn open(tb: &Testbed) -> Self {
        let mut policy = Self {
            identities: LpmTrie::try_from(open(tb, names::POLICY_IDENTITIES)).unwrap(),
            subjects: Array::try_from(open(tb, names::POLICY_ENDPOINTS)).unwrap(),
            rules: LpmTrie::try_from(open(tb, names::POLICY_RULES)).unwrap(),
            endpoints: HashMap::try_from(open(tb, names::ENDPOINTS)).unwrap(),
        };
        let world = Key::new(identity_prefix_len(0), ip_key(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        policy.identities.insert(&world, PolicyIdentity { identity: IDENTITY_WORLD, pad: 0 }, 0).unwrap();
        // The node's own address, as the agent writes it.
        policy.identity(NODE_IP.parse::<Ipv4Addr>().unwrap(), IDENTITY_HOST);
        policy
    }

    fn identity(&mut self, ip: Ipv4Addr, identity: u32) {
        let key = Key::new(identity_prefix_len(32), IpKey::v4(ip.octets()));
        self.identities.insert(&key, PolicyIdentity { identity, pad: 0 }, 0).unwrap();
    }

    fn identity6(&mut self, ip: Ipv6Addr, identity: u32) {
        let key = Key::new(identity_prefix_len(128), IpKey::v6(ip.octets()));
        self.identities.insert(&key, PolicyIdentity { identity, pad: 0 }, 0).unwrap();
    }

    fn subject(&mut self, ip: Ipv4Addr, identity: u32, flags: u32) {
        let ep = self.endpoints.get(&IpKey::v4(ip.octets()), 0).unwrap();
        let slot = PolicyEndpoint {
            ifindex: ep.host_ifindex,
            flags,
            owner: ep.owner,
            identity,
            ingress_slot: 1,
            egress_slot: 2,
            pad: 0,
        };
        self.subjects.set(host_veth_slot(ep.host_ifindex), slot, 0).unwrap();
    }

    fn allow_port(&mut self, subject: u32, peer: u32, direction: u8, protocol: u8, port: u16) {
        let data = PolicyRuleKey { subject, peer, direction, protocol, port_be: port.to_be_bytes() };
        self.rules.insert(&Key::new(POLICY_RULE_FULL_BITS, data), PolicyRule { slot: 3, pad: 0 }, 0).unwrap();
    }
}

fn reaches_tcp(netns: &str, at: impl Into<SocketAddr>) -> bool {
    probe::ask_tcp(netns, at).is_ok()
}

/// kube-proxy's NodePort (DNAT on the node's address, and MASQUERADE, as it marks NodePort
/// traffic) in front of an ingress-isolated backend: the masqueraded packet reaches the
/// backend from the node's own address. The node's free pass (kubelet's probes) is for what
/// the node itself sends, not for whatever the stack forwarded and rewrote to its address: a
/// pod the backend does not allow must not get in through the NodePort.
#[test]
fn a_pod_through_a_masquerading_nodeport_is_not_the_node() {
    let test = "a_pod_through_a_masquerading_nodeport_is_not_the_node";
    let Some(mut tb) = Testbed::for_test(test, "atk1", "10.231.0.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, b) = (&pods[0], &pods[1]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(b.ip, 8080)).unwrap();
    run_in(&tb.node.name, "sysctl", &["-qw", "net.ipv4.ip_forward=1"]).unwrap();
    let to = format!("{}:8080", b.ip);
    let dnat = ["-t", "nat", "-A", "PREROUTING", "-d", NODE_IP, "-p", "tcp", "--dport", "30080", "-j", "DNAT"];
    run_in(&tb.node.name, "iptables", &[&dnat[..], &["--to-destination", &to]].concat()).unwrap();
    let b_ip = b.ip.to_string();
    let masq = ["-t", "nat", "-A", "POSTROUTING", "-d", &b_ip, "-p", "tcp", "--dport", "8080", "-j", "MASQUERADE"];
    run_in(&tb.node.name, "iptables", &masq).unwrap();
    let nodeport = SocketAddrV4::new(NODE_IP.parse().unwrap(), 30080);
    assert!(reaches_tcp(&ns[0], nodeport), "a → NodePort → b without policy");

    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    policy.identity(b.ip, B);
    // b lets nothing in (the node's own probes aside).
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED);
    assert!(reaches_tcp(&tb.node.name, SocketAddrV4::new(b.ip, 8080)), "the node's own probe → b");
    assert!(!reaches_tcp(&ns[0], SocketAddrV4::new(b.ip, 8080)), "a → b straight: denied");
    assert!(!reaches_tcp(&ns[0], nodeport), "a → NodePort → b: masqueraded to the node's address, let in as the node");
    // b's hairpin through its own NodePort (masqueraded too) is still b's own business.
    assert!(reaches_tcp(&ns[1], nodeport), "b → NodePort → b (hairpin)");
    drop(servers);
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// A TCP first fragment (offset 0, more fragments) whose 8 bytes of TCP header hold the ports
/// but not the flags: the policy's parser could not read the 14 bytes it wants and let the
/// packet through unjudged, to a port no rule allows. With later fragments passing (once the
/// reassembly of allowed flows' fragments is fixed), the receiver would get a whole segment.
#[test]
fn a_tcp_first_fragment_too_short_for_its_flags_is_judged() {
    let test = "a_tcp_first_fragment_too_short_for_its_flags_is_judged";
    let Some(mut tb) = Testbed::for_test(test, "atk2", "10.232.0.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, b) = (&pods[0], &pods[1]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    policy.identity(b.ip, B);
    // b lets a in on TCP 8080 only.
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED);
    policy.allow_port(B, A, POLICY_DIRECTION_INGRESS, TCP, 8080);

    let sender = PacketSocket::open(&ns[0], "eth0").unwrap();
    let receiver = PacketSocket::open(&ns[1], "eth0").unwrap();
    let _ = receiver.received();
    let frame = |tcp: &[u8], more_fragments: bool| {
        let mut ip = frames::ipv4(a.ip, b.ip, TCP, tcp);
        if more_fragments {
            ip[6] = 0x20;
        }
        ip[4..6].copy_from_slice(&0x4242u16.to_be_bytes());
        let sum = frames::checksum(&ip[..20]);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        [ethernet(a.host_mac, a.pod_mac, 0x0800), ip].concat()
    };
    let to_port = |frames: &[Vec<u8>], port: u16| {
        frames.iter().filter(|f| f.len() >= 38 && f[30..34] == b.ip.octets() && f[36..38] == port.to_be_bytes()).count()
    };
    // Control: a whole SYN to 9090 is denied.
    let syn = frames::tcp(40_000, 9090, 0x02);
    sender.send(&frame(&syn, false)).unwrap();
    assert_eq!(to_port(&receiver.received(), 9090), 0, "a whole SYN to b:9090 got in");
    // The attack: the same SYN's first 8 bytes as a first fragment.
    sender.send(&frame(&syn[..8], true)).unwrap();
    assert_eq!(to_port(&receiver.received(), 9090), 0, "a first fragment without TCP flags got into b:9090 unjudged");
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// An egress-isolated pod whose policy allows nothing out still reaches every service of its
/// own node (kubelet, a hostNetwork pod's server, the node's sshd): a packet to one of the
/// node's addresses goes to the stack, which delivers it locally, and the egress check is taken
/// only where the stack forwards. Not fixed: see the report (the check before the stack's DNAT
/// would judge a kube-proxy NodePort against the node's address, not against its backend).
#[test]
#[ignore = "known hole: egress isolation does not cover the node's own addresses (delivered locally by the \
            stack, never forwarded, so neither from_pod nor to_pod/to_uplink judge it)"]
fn an_egress_isolated_pod_does_not_reach_its_node() {
    let test = "an_egress_isolated_pod_does_not_reach_its_node";
    let Some(mut tb) = Testbed::for_test(test, "atk3", "10.233.0.0/24") else { return };
    let pods = tb.add_attachments(1).unwrap();
    let a = &pods[0];
    let ns = tb.pods[0].netns.name.clone();
    let mut servers = Servers::default();
    let on_node = SocketAddrV4::new(NODE_IP.parse().unwrap(), 10250);
    servers.tcp(&tb.node.name, on_node).unwrap();
    assert!(reaches_tcp(&ns, on_node), "a → the node's 10250 without policy");
    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    // a: egress isolated, nothing allowed out.
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED);
    assert!(!reaches_tcp(&ns, on_node), "a (no egress allowed) → the node's 10250");
    drop(servers);
    drop(policy);
    tb.del(0).unwrap();
}

/// A UDP datagram (checksum left for `frames::ipv6` to fill in).
fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u16;
    [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &len.to_be_bytes(), &[0, 0], payload].concat()
}

/// Frames `receiver` got that are UDP to `port` (IPv4 or IPv6, no options or extensions).
fn udp_to_port(frames: &[Vec<u8>], port: u16) -> usize {
    let dst_port = |f: &Vec<u8>| match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 if f.len() >= 38 && f[23] == 17 => Some([f[36], f[37]]),
        0x86dd if f.len() >= 58 && f[20] == 17 => Some([f[56], f[57]]),
        _ => None,
    };
    frames.iter().filter(|f| f.len() > 14 && dst_port(f) == Some(port.to_be_bytes())).count()
}

/// A LAN host sends a pod of node 1 a datagram whose source is node 1's own IPv6 address. IPv4
/// has the kernel's martian-source check against that; IPv6 has none, so the node's stack
/// forwarded it, and `to_pod` took it for the node's own (kubelet's) traffic: let in, whatever
/// the pod's policy.
#[test]
fn a_lan_host_forging_the_nodes_ipv6_address_is_not_the_node() {
    let test = "a_lan_host_forging_the_nodes_ipv6_address_is_not_the_node";
    let plan = Ipv6Plan { cluster_cidr: "fd00:10:234::/56", subnets: ["fd00:10:234:1::/64", "fd00:10:234:2::/64"] };
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "atk4", "10.234.0.0/16", ["10.234.1.0/24", "10.234.2.0/24"], plan)
    else {
        return;
    };
    let x = lan.add_pod(0).unwrap();
    let x6 = x.ip6.unwrap();
    let node6: Ipv6Addr = LAN_NODE_IPV6S[0].parse().unwrap();
    let mut policy = Policy::open(&lan.nodes[0]);
    policy.identity6(node6, IDENTITY_HOST);
    policy.identity(x.ip, A);
    policy.identity6(x6, A);
    // x lets nothing in (the node's own probes aside).
    policy.subject(x.ip, A, POLICY_INGRESS_ISOLATED);

    let node_mac = lan.node_mac(0).unwrap();
    let host_mac = link_mac(&lan.host.name, "eth0").unwrap();
    let sender = PacketSocket::open(&lan.host.name, "eth0").unwrap();
    let receiver = PacketSocket::open(&x.netns, "eth0").unwrap();
    let _ = receiver.received();
    let datagram = |from: Ipv6Addr| {
        let ip = frames::ipv6(from, x6, 17, &udp(4000, 5353, b"forged"));
        [ethernet(node_mac, host_mac, 0x86dd), ip].concat()
    };
    // Control: from the LAN host's own address, denied.
    sender.send(&datagram(LAN_HOST_V6.parse().unwrap())).unwrap();
    assert_eq!(udp_to_port(&receiver.received(), 5353), 0, "the LAN host's own datagram got into x");
    sender.send(&datagram(node6)).unwrap();
    assert_eq!(udp_to_port(&receiver.received(), 5353), 0, "a datagram forging node 1's IPv6 address got into x");
    drop(policy);
    lan.del_pod(0, 0).unwrap();
}

/// A LAN host sends a pod of node 1 a datagram whose source is a pod of node 2 that the policy
/// allows: `from_uplink` delivers cluster sources from the LAN straight into the pod, judged
/// by the source address's identity, and nothing ties a pod address of node 2 to node 2's
/// frames. Blind (the replies go to the real pod), but one-way UDP gets in, and a TCP SYN
/// reaches the listener. Routed (host-gw) mode trusts the underlay, as Calico's and Cilium's
/// native routing do; a fix would check that a cluster source's frame comes from the MAC of
/// the node whose pod subnet holds it.
#[test]
#[ignore = "known limit: from the uplink, a cluster source address is trusted (routed mode trusts the underlay); \
            a LAN host forging an allowed remote pod's address gets its identity"]
fn a_lan_host_forging_a_remote_pods_address_is_not_that_pod() {
    let test = "a_lan_host_forging_a_remote_pods_address_is_not_that_pod";
    let Some(mut lan) = Lan::for_test(test, "atk5", "10.235.0.0/16", ["10.235.1.0/24", "10.235.2.0/24"]) else {
        return;
    };
    let x = lan.add_pod(0).unwrap();
    let y = lan.add_pod(1).unwrap();
    let mut policy = Policy::open(&lan.nodes[0]);
    policy.identity(x.ip, A);
    policy.identity(y.ip, B);
    // x lets y in on UDP 5353, nothing else.
    policy.subject(x.ip, A, POLICY_INGRESS_ISOLATED);
    policy.allow_port(A, B, POLICY_DIRECTION_INGRESS, 17, 5353);

    let node_mac = lan.node_mac(0).unwrap();
    let host_mac = link_mac(&lan.host.name, "eth0").unwrap();
    let sender = PacketSocket::open(&lan.host.name, "eth0").unwrap();
    let receiver = PacketSocket::open(&x.netns, "eth0").unwrap();
    let _ = receiver.received();
    let datagram = |from: Ipv4Addr| {
        let ip = frames::ipv4(from, x.ip, 17, &udp(4000, 5353, b"forged"));
        frames::with_checksums([ethernet(node_mac, host_mac, 0x0800), ip].concat())
    };
    sender.send(&datagram(LAN_HOST.parse().unwrap())).unwrap();
    assert_eq!(udp_to_port(&receiver.received(), 5353), 0, "the LAN host's own datagram got into x");
    sender.send(&datagram(y.ip)).unwrap();
    assert_eq!(udp_to_port(&receiver.received(), 5353), 0, "a datagram forging y's address got into x");
    drop(policy);
    lan.del_pod(0, 0).unwrap();
    lan.del_pod(1, 0).unwrap();
}

/// A second Pod object whose `status.podIPs` claims a policy-isolated pod's address (a pod whose
/// address was reused while its object lingers, or a status written by a compromised kubelet):
/// the compiler gave the address's identity to one pod and the address itself to the other,
/// so the isolated pod was no subject any more, and everything got in.
#[test]
fn a_second_pod_claiming_an_isolated_pods_address_does_not_lift_its_isolation() {
    let test = "a_second_pod_claiming_an_isolated_pods_address_does_not_lift_its_isolation";
    let Some(mut tb) = Testbed::for_test(test, "atk6", "10.236.0.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, b) = (&pods[0], &pods[1]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(b.ip, 8080)).unwrap();
    let deny_all = json!([{
        "metadata": {"namespace": "x", "name": "deny-in"},
        "spec": {"podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"]},
    }]);
    let input = |extra: Vec<Value>| {
        let mut pods = vec![
            pod_object_in("x", "a", json!({"app": "client"}), a.ip),
            pod_object_in("x", "b", json!({"app": "server"}), b.ip),
        ];
        pods.extend(extra);
        json!({
            "namespaces": [{"metadata": {"name": "x"}}, {"metadata": {"name": "zzz"}}],
            "pods": pods,
            "networkPolicies": deny_all,
        })
    };
    policy_set(&tb, &input(vec![]));
    assert!(!reaches_tcp(&ns[0], SocketAddrV4::new(b.ip, 8080)), "a → b: b lets nothing in");
    policy_set(&tb, &input(vec![pod_object_in("zzz", "rogue", json!({}), b.ip)]));
    assert!(!reaches_tcp(&ns[0], SocketAddrV4::new(b.ip, 8080)), "a → b once a rogue pod claims b's address");
    drop(servers);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}
