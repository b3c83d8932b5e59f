//! NetworkPolicy in the datapath, with the maps written straight from the test (as the agent
//! would): isolation, rules by peer and port, the flow cache's replies (TCP and UDP), counts,
//! and the attacks the cache must stand: denied packets create nothing and evict nothing, a
//! forged ACK or reply from an unallowed peer opens nothing.
use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream},
    path::Path,
    time::Duration,
};

use aya::maps::{
    Array, HashMap, Map, MapData, PerCpuArray,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_cni_tests::{
    Attached, Cluster, NODE_IP, Testbed,
    frames::{self, ethernet},
    probe::{self, Servers},
    prog_run::{self, TC_ACT_SHOT},
    run_in,
    traffic::in_netns,
};
use ebpf_common::{
    DropReason, Endpoint, FlowKey, IDENTITY_HOST, IDENTITY_WORLD, IpKey, POLICY_DIRECTION_EGRESS,
    POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED, POLICY_INGRESS_ISOLATED, POLICY_RULE_ANY_PORT_BITS,
    POLICY_RULE_FULL_BITS, PolicyCount, PolicyEndpoint, PolicyFlow, PolicyIdentity, PolicyRule, PolicyRuleKey,
    host_veth_slot, identity_prefix_len, names,
};
use serde_json::{Value, json};

const TCP: u8 = 6;
const UDP: u8 = 17;

/// The pinned policy maps of one node, opened as the agent opens them.
struct Policy {
    identities: LpmTrie<MapData, IpKey, PolicyIdentity>,
    subjects: Array<MapData, PolicyEndpoint>,
    rules: LpmTrie<MapData, PolicyRuleKey, PolicyRule>,
    flows: HashMap<MapData, FlowKey, PolicyFlow>,
    counts: PerCpuArray<MapData, PolicyCount>,
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
            flows: HashMap::try_from(open(tb, names::POLICY_FLOWS)).unwrap(),
            counts: PerCpuArray::try_from(open(tb, names::POLICY_COUNTS)).unwrap(),
            endpoints: HashMap::try_from(open(tb, names::ENDPOINTS)).unwrap(),
        };
        policy.identity_prefix(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, IDENTITY_WORLD);
        policy.identity_prefix(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, IDENTITY_WORLD);
        policy
    }

    fn identity_prefix(&mut self, ip: IpAddr, bits: u32, identity: u32) {
        let key = Key::new(identity_prefix_len(bits), ip_key(ip));
        self.identities.insert(&key, PolicyIdentity { identity, pad: 0 }, 0).unwrap();
    }

    fn identity(&mut self, ip: impl Into<IpAddr>, identity: u32) {
        let ip = ip.into();
        self.identity_prefix(ip, if ip.is_ipv4() { 32 } else { 128 }, identity);
    }

    /// Makes the pod at `ip` (on this node) subject `identity`, isolated by `flags`.
    fn subject(&mut self, ip: impl Into<IpAddr>, identity: u32, flags: u32, ingress_slot: u32, egress_slot: u32) {
        let ep = self.endpoints.get(&ip_key(ip.into()), 0).unwrap();
        let slot = PolicyEndpoint {
            ifindex: ep.host_ifindex,
            flags,
            owner: ep.owner,
            identity,
            ingress_slot,
            egress_slot,
            pad: 0,
        };
        self.subjects.set(host_veth_slot(ep.host_ifindex), slot, 0).unwrap();
    }

    /// Allows `subject` ↔ `peer` in `direction` for `protocol`, on `port` or every port.
    fn allow(&mut self, subject: u32, peer: u32, direction: u8, protocol: u8, port: Option<u16>, slot: u32) {
        let bits = if port.is_some() { POLICY_RULE_FULL_BITS } else { POLICY_RULE_ANY_PORT_BITS };
        let data =
            PolicyRuleKey { subject, peer, direction, protocol, port_be: port.unwrap_or_default().to_be_bytes() };
        self.rules.insert(&Key::new(bits, data), PolicyRule { slot, pad: 0 }, 0).unwrap();
    }

    /// `POLICY_FLOWS` entries with `ip` on either side.
    fn flows_of(&self, ip: impl Into<IpAddr>) -> usize {
        let key = ip_key(ip.into()).addr;
        self.flows.keys().filter_map(Result::ok).filter(|k| k.src_addr == key || k.dst_addr == key).count()
    }

    fn all_flows(&self) -> Vec<FlowKey> {
        self.flows.keys().filter_map(Result::ok).collect()
    }

    fn forget_flows(&mut self) {
        for key in self.all_flows() {
            let _ = self.flows.remove(&key);
        }
    }

    /// (allowed, denied) flows counted on `slot`, over the CPUs.
    fn counted(&self, slot: u32) -> (u64, u64) {
        let values = self.counts.get(&slot, 0).unwrap();
        values.iter().fold((0, 0), |(a, d), c| (a + c.allowed_flows, d + c.denied_flows))
    }
}

const A: u32 = 256;
const B: u32 = 257;
const C: u32 = 258;

fn v4(pod: &Attached) -> Ipv4Addr {
    pod.ip
}

fn reaches_tcp(netns: &str, at: impl Into<SocketAddr>) -> bool {
    probe::ask_tcp(netns, at).is_ok()
}

fn reaches_udp(netns: &str, at: impl Into<SocketAddr>) -> bool {
    probe::ask_udp(netns, at).is_ok()
}

fn tcp_frame(from: &Attached, to: Ipv4Addr, ports: (u16, u16), flags: u8) -> Vec<u8> {
    let segment = frames::ipv4(from.ip, to, TCP, &frames::tcp(ports.0, ports.1, flags));
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), segment].concat())
}

/// An echo server on `at` in `netns` for one connection: answers every read with what it read.
fn echo_once(netns: &str, at: SocketAddr) -> std::thread::JoinHandle<()> {
    let listener: TcpListener = in_netns(netns, move || Ok(TcpListener::bind(at)?)).unwrap();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        let mut buf = [0u8; 64];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 || stream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    })
}

fn exchange(stream: &mut TcpStream, message: &[u8]) -> bool {
    let mut buf = [0u8; 64];
    stream.write_all(message).is_ok() && stream.read(&mut buf).is_ok_and(|n| &buf[..n] == message)
}

#[test]
fn isolated_pods_on_one_node_get_what_their_rules_allow_and_the_replies() {
    let test = "isolated_pods_on_one_node_get_what_their_rules_allow_and_the_replies";
    let Some(mut tb) = Testbed::for_test(test, "pol", "10.215.0.0/24") else { return };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    for port in [8080, 9090] {
        servers.tcp(&ns[1], SocketAddrV4::new(v4(b), port)).unwrap();
    }
    servers.udp(&ns[1], SocketAddrV4::new(v4(b), 5353)).unwrap();
    servers.tcp(&ns[0], SocketAddrV4::new(v4(a), 7070)).unwrap();
    servers.tcp(&ns[2], SocketAddrV4::new(v4(c), 8080)).unwrap();

    let mut policy = Policy::open(&tb);
    for (pod, id) in [(a, A), (b, B), (c, C)] {
        policy.identity(v4(pod), id);
    }
    policy.identity(NODE_IP.parse::<Ipv4Addr>().unwrap(), IDENTITY_HOST);
    // b: ingress isolated (denials on slot 1); a may reach it on TCP 8080 (slot 2) and UDP (3).
    policy.subject(v4(b), B, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(8080), 2);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, None, 3);

    let at = |pod: &Attached, port| SocketAddrV4::new(v4(pod), port);
    assert!(reaches_tcp(&ns[0], at(b, 8080)), "a → b:8080 is allowed");
    assert!(reaches_udp(&ns[0], at(b, 5353)), "a → b UDP is allowed, and its reply passes");
    let denied_before = tb.drops(DropReason::PolicyDenied).unwrap();
    assert!(!reaches_tcp(&ns[0], at(b, 9090)), "a → b:9090: no rule");
    assert!(!reaches_tcp(&ns[2], at(b, 8080)), "c → b: no rule");
    assert!(tb.drops(DropReason::PolicyDenied).unwrap() >= denied_before + 2, "denials counted in METRICS");
    assert!(policy.counted(1).1 >= 2, "denials counted on b's ingress slot: {:?}", policy.counted(1));
    assert!(policy.counted(2).0 >= 1 && policy.counted(3).0 >= 1, "allowed flows counted on their policies");
    assert_eq!(policy.flows_of(v4(c)), 0, "a denied flow left state");
    // c is in no policy: it reaches and is reached as before.
    assert!(reaches_tcp(&ns[2], at(a, 7070)), "c → a (no policy)");
    assert!(reaches_tcp(&ns[0], at(c, 8080)), "a → c (no policy)");
    // The node (kubelet's probes) is always let in, through the stack's path (`to_pod`).
    assert!(reaches_tcp(&tb.node.name, at(b, 9090)), "node → b:9090");

    // a: isolated both ways, nothing allowed in, out only to b on TCP 8080 and UDP. The replies
    // of what it opens come back in; nothing else does, and nothing else goes out.
    policy.subject(v4(a), A, POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED, 4, 5);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(8080), 6);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(8081), 6);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, UDP, None, 6);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(8081), 2);
    assert!(reaches_tcp(&ns[0], at(b, 8080)), "a → b:8080 and its replies into a");
    assert!(reaches_udp(&ns[0], at(b, 5353)), "a → b UDP and its reply into a");
    assert!(!reaches_tcp(&ns[0], at(c, 8080)), "a → c: a's egress allows only b");
    assert!(!reaches_tcp(&ns[2], at(a, 7070)), "c → a: a lets nothing in");
    assert!(!reaches_tcp(&ns[1], at(a, 7070)), "b → a: a lets nothing in");
    assert!(policy.counted(5).1 >= 1 && policy.counted(4).1 >= 2, "a's denials on its slots");

    // A connection whose entries are forgotten (an LRU eviction) goes on: its next segment is
    // judged again and allowed.
    let server = echo_once(&ns[1], SocketAddr::V4(at(b, 8081)));
    let to = SocketAddr::V4(at(b, 8081));
    let mut stream = in_netns(&ns[0], move || Ok(TcpStream::connect_timeout(&to, Duration::from_secs(2))?)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(exchange(&mut stream, b"one"), "a ↔ b:8081");
    policy.forget_flows();
    assert!(exchange(&mut stream, b"two"), "the connection died with its entries");
    drop(stream);
    server.join().unwrap();

    // Forged from c (no rule anywhere lets c talk to a or b): an ACK into b's port 8080, a
    // SYN-ACK "answering" a connection a might have opened to c, a reply from c's 8080 to b.
    // All dropped as policy's, none leaves an entry.
    let before = policy.flows_of(v4(c));
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    for (to, ports, flags) in [
        (v4(b), (40_000, 8080), 0x10),
        (v4(a), (8080, 40_001), 0x12),
        (v4(b), (8080, 40_002), 0x18),
        (v4(a), (7070, 40_003), 0x10),
    ] {
        let (verdict, _) = prog_run::run(&tb, "from_pod", &c.host_ifname, tcp_frame(c, to, ports, flags));
        assert_eq!(verdict, TC_ACT_SHOT, "forged {flags:#x} from c to {to} {ports:?} passed");
    }
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 4);
    assert_eq!(policy.flows_of(v4(c)), before, "a forged segment created state");

    // A flood of denied SYNs (each from another port) creates nothing and evicts nothing: the
    // allowed flows' entries are all still there, and a's flow to b still goes.
    assert!(reaches_tcp(&ns[0], at(b, 8080)));
    let held = policy.all_flows();
    for port in 0..500u16 {
        let (verdict, _) =
            prog_run::run(&tb, "from_pod", &c.host_ifname, tcp_frame(c, v4(b), (20_000 + port, 8080), 0x02));
        assert_eq!(verdict, TC_ACT_SHOT);
    }
    let after = policy.all_flows();
    assert!(held.iter().all(|k| after.contains(k)), "a denied flood evicted an allowed flow's entry");
    assert_eq!(after.len(), held.len(), "a denied flood created entries");
    assert!(reaches_tcp(&ns[0], at(b, 8080)), "a → b:8080 after the flood");

    // DEL clears the pod's subject slot, GC the rest.
    drop(servers);
    let slot_of = |policy: &Policy, ip: Ipv4Addr| {
        let ep = policy.endpoints.get(&IpKey::v4(ip.octets()), 0).unwrap();
        policy.subjects.get(&host_veth_slot(ep.host_ifindex), 0).unwrap()
    };
    let a_slot = host_veth_slot(policy.endpoints.get(&IpKey::v4(v4(a).octets()), 0).unwrap().host_ifindex);
    assert_ne!(slot_of(&policy, v4(a)).flags, 0);
    tb.del(0).unwrap();
    assert_eq!(policy.subjects.get(&a_slot, 0).unwrap(), PolicyEndpoint::default(), "DEL left a's subject slot");
    let b_slot = host_veth_slot(policy.endpoints.get(&IpKey::v4(v4(b).octets()), 0).unwrap().host_ifindex);
    tb.gc(&[2]).unwrap();
    drop(policy);
    let subjects: Array<MapData, PolicyEndpoint> = match Path::new(&tb.map_pin(names::POLICY_ENDPOINTS)).exists() {
        true => Array::try_from(open(&tb, names::POLICY_ENDPOINTS)).unwrap(),
        false => return,
    };
    assert_eq!(subjects.get(&b_slot, 0).unwrap(), PolicyEndpoint::default(), "GC left b's subject slot");
    tb.del(2).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn across_nodes_the_receiving_node_enforces_ingress() {
    let Some(mut c) = Cluster::for_test(
        "across_nodes_the_receiving_node_enforces_ingress",
        "polx",
        "10.216.0.0/16",
        ["10.216.1.0/24", "10.216.2.0/24"],
    ) else {
        return;
    };
    let mut ips: Vec<Ipv4Addr> = Vec::new();
    for node in [0, 0, 1] {
        let pod = c.nodes[node].new_pod().unwrap();
        ips.push(c.nodes[node].add(pod).unwrap().parse().unwrap());
    }
    let (x, z, y) = (ips[0], ips[1], ips[2]);
    let ns = |node: usize, pod: usize| c.nodes[node].pods[pod].netns.name.clone();
    let mut servers = Servers::default();
    servers.tcp(&ns(1, 0), SocketAddrV4::new(y, 8080)).unwrap();
    servers.udp(&ns(1, 0), SocketAddrV4::new(y, 5353)).unwrap();

    // Node 2's maps: y isolated for ingress, x allowed on TCP 8080 and UDP, z not at all.
    let mut policy = Policy::open(&c.nodes[1]);
    for (ip, id) in [(x, A), (y, B), (z, C)] {
        policy.identity(ip, id);
    }
    policy.subject(y, B, POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED, 1, 2);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(8080), 3);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, None, 3);
    assert!(reaches_tcp(&ns(0, 0), SocketAddrV4::new(y, 8080)), "x → y:8080 across nodes");
    assert!(reaches_udp(&ns(0, 0), SocketAddrV4::new(y, 5353)), "x → y UDP across nodes, and the reply");
    assert!(!reaches_tcp(&ns(0, 1), SocketAddrV4::new(y, 8080)), "z → y: no rule");
    assert!(c.nodes[1].drops(DropReason::PolicyDenied).unwrap() >= 1);
    assert!(policy.counted(1).1 >= 1 && policy.counted(3).0 >= 2, "{:?} {:?}", policy.counted(1), policy.counted(3));
    assert_eq!(policy.flows_of(z), 0, "a denied flow left state");
    drop(servers);
    drop(policy);
    for node in &c.nodes {
        for pod in 0..node.pods.len() {
            node.del(pod).unwrap();
        }
    }
}

const V6_SUBNET: &str = "fd00:10:217::/64";

#[test]
fn ipv6_flows_are_judged_like_ipv4() {
    let test = "ipv6_flows_are_judged_like_ipv4";
    let Some(mut tb) = Testbed::for_test(test, "pol6", "10.217.0.0/24") else { return };
    let ranges: Vec<Value> = ["10.217.0.0/24", V6_SUBNET].iter().map(|s| json!([{ "subnet": s }])).collect();
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    let mut v6: Vec<Ipv6Addr> = Vec::new();
    for _ in 0..3 {
        let pod = tb.new_pod().unwrap();
        let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
        assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
        let address = out.json()["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        v6.push(address.parse().unwrap());
    }
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    // Duplicate address detection would hold the addresses back for a while.
    for name in &ns {
        let _ = run_in(name, "sysctl", &["-qw", "net.ipv6.conf.all.accept_dad=0"]);
    }
    std::thread::sleep(Duration::from_secs(2));
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV6::new(v6[1], 8080, 0, 0)).unwrap();
    servers.udp(&ns[1], SocketAddrV6::new(v6[1], 5353, 0, 0)).unwrap();

    let mut policy = Policy::open(&tb);
    for (ip, id) in v6.iter().zip([A, B, C]) {
        policy.identity(*ip, id);
    }
    policy.subject(v6[1], B, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(8080), 2);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, Some(5353), 2);
    let b = |port| SocketAddrV6::new(v6[1], port, 0, 0);
    assert!(reaches_tcp(&ns[0], b(8080)), "a → b:8080 over IPv6");
    assert!(reaches_udp(&ns[0], b(5353)), "a → b UDP over IPv6, and the reply");
    assert!(!reaches_tcp(&ns[2], b(8080)), "c → b over IPv6: no rule");
    assert!(policy.counted(1).1 >= 1, "{:?}", policy.counted(1));
    assert_eq!(policy.flows_of(v6[2]), 0, "a denied flow left state");
    // Echo is no rule's: a's ping to b is dropped (b's address itself resolves: neighbour
    // discovery is no policy's business, or nothing above would have passed).
    assert!(run_in(&ns[0], "ping", &["-6", "-c", "1", "-W", "2", &v6[1].to_string()]).is_err(), "ICMPv6 to b: no rule");
    drop(servers);
    drop(policy);
    for pod in 0..3 {
        tb.del(pod).unwrap();
    }
}
