//! Issue 24, item 8: a pod that served a Service gets back to the fast path once its Service
//! flows are gone. The stack marks the pod with the stack epoch (`Endpoint::stack_epoch`) when
//! it hands it a Service's flow; GC (and the agent, every interval) renews the marks of pods
//! whose `FLOWS` entries live on and advances the epoch. A live Service connection, however
//! idle, keeps its replies on the stack through any number of advances, and a FIN or RST
//! forged from the peer's side does not shorten it; one the pod closed itself (FIN, RST) ages as
//! conntrack's does, and then the pod's packets take the fast path again, with no `FLOWS` lookup.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    time::Duration,
};

use aya::maps::{Array, HashMap, Map, MapData};
use ebpf_cni_tests::{
    Attached, Cluster, Testbed,
    frames::{ethernet, ipv4, tcp, with_checksums},
    kube_proxy::{self, Flavour, Protocol, Service},
    probe::{self, Servers},
    prog_run::run_arrived,
    traffic,
};
use ebpf_common::{
    Endpoint, FLOW_FIN, FLOW_RST, FLOW_TIMEOUT_TCP_RST_NS, FlowEntry, FlowKey, ForwardPath, IpKey, stack_epoch_live,
};

const CLUSTER_CIDR: &str = "10.209.0.0/16";
const PORT: u16 = 8080;
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 9, 1), 80);

fn open(tb: &Testbed, name: &str) -> Map {
    Map::from_map_data(MapData::from_pin(tb.map_pin(name)).unwrap()).unwrap()
}

fn endpoint(tb: &Testbed, ip: Ipv4Addr) -> Endpoint {
    let map: HashMap<_, IpKey, Endpoint> = HashMap::try_from(open(tb, "ENDPOINTS")).unwrap();
    map.get(&IpKey::v4(ip.octets()), 0).unwrap()
}

fn epoch(tb: &Testbed) -> u32 {
    let map: Array<_, u32> = Array::try_from(open(tb, "STACK_EPOCH")).unwrap();
    map.get(&0, 0).unwrap()
}

/// Whether `ip`'s pod needs its packets looked up in `FLOWS`, as the programs judge it.
fn marked(tb: &Testbed, ip: Ipv4Addr) -> bool {
    stack_epoch_live(endpoint(tb, ip).stack_epoch, epoch(tb))
}

/// The flags of the `FLOWS` entries keyed by `server`'s replies to `client`.
fn flow_flags(tb: &Testbed, server: Ipv4Addr, client: Ipv4Addr) -> Vec<u32> {
    let map: HashMap<_, FlowKey, FlowEntry> = HashMap::try_from(open(tb, "FLOWS")).unwrap();
    let (server, client) = (ebpf_common::ipv4_in_16(server.octets()), ebpf_common::ipv4_in_16(client.octets()));
    map.iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.protocol == 6 && k.src_addr == server && k.dst_addr == client)
        .map(|(_, e)| e.flags)
        .collect()
}

/// A Service connection: the client's end and the server's.
struct Connection {
    client: TcpStream,
    server: TcpStream,
}

impl Connection {
    fn open(client_ns: &str, listener: &std::net::TcpListener) -> Self {
        let client = traffic::tcp_connect(client_ns, 0, VIP).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Self { client, server }
    }

    /// One request and its answer; false if either got lost (a reply that skipped the stack
    /// reaches the client from the pod's address, not the ClusterIP's, and is reset).
    fn exchange(&mut self) -> bool {
        let mut buf = [0u8; 5];
        self.client.write_all(b"hello").is_ok()
            && self.server.read_exact(&mut buf).is_ok()
            && self.server.write_all(b"world").is_ok()
            && self.client.read_exact(&mut buf).is_ok()
            && &buf == b"world"
    }

    /// The client's port, as the server sees it.
    fn client_port(&self) -> u16 {
        self.server.peer_addr().unwrap().port()
    }
}

/// A segment from the client to the server through the stack (`to_pod`), as a peer's forged FIN
/// or RST in the connection's 4-tuple would arrive once conntrack let it through as INVALID.
fn peer_segment(tb: &Testbed, server: &Attached, client_ip: Ipv4Addr, client_port: u16, flags: u8) {
    let frame = with_checksums(
        [
            ethernet(server.pod_mac, server.host_mac, 0x0800),
            ipv4(client_ip, server.ip, 6, &tcp(client_port, PORT, flags)),
        ]
        .concat(),
    );
    run_arrived(tb, "to_pod", &server.host_ifname, "lo", frame);
}

#[test]
fn a_pod_that_served_a_service_gets_back_to_the_fast_path() {
    let Some(mut c) = Cluster::for_test(
        "a_pod_that_served_a_service_gets_back_to_the_fast_path",
        "sep",
        CLUSTER_CIDR,
        ["10.209.1.0/24", "10.209.2.0/24"],
    ) else {
        return;
    };
    let node = &mut c.nodes[0];
    let (client, server) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let client_ip: Ipv4Addr = node.add(client).unwrap().parse().unwrap();
    let server_at = node.add_attachment(server).unwrap();
    let server_ip = server_at.ip;
    let service = Service::new("default/epochs:http", Protocol::Tcp, VIP, &[SocketAddrV4::new(server_ip, PORT)]);
    kube_proxy::install(&node.node.name, Flavour::Iptables, CLUSTER_CIDR, &[service]).unwrap();
    let (client_ns, server_ns) = (node.pods[client].netns.name.clone(), node.pods[server].netns.name.clone());
    let listener = traffic::tcp_listener(&server_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).unwrap();
    let mut servers = Servers::default();
    servers.tcp(&client_ns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT + 1)).unwrap();
    let valid = [client, server];
    assert!(!marked(node, server_ip), "a pod no Service used is marked");

    // A Service connection: the stack delivers it to the server, whose replies go back through
    // the stack (conntrack undoes the DNAT) for as long as it lives.
    let mut conn = Connection::open(&client_ns, &listener);
    assert!(conn.exchange(), "the Service connection does not work");
    assert!(marked(node, server_ip), "the stack delivered a Service flow and the pod is not marked");
    // Any number of advances while it lives (idle, here) leaves it marked, and it keeps working.
    let stack_before = node.forwarded(ForwardPath::StackFlow).unwrap();
    for _ in 0..4 {
        node.gc(&valid).unwrap();
    }
    assert!(epoch(node) >= 4, "GC did not advance the stack epoch");
    assert!(marked(node, server_ip), "GC let a pod with a live Service connection lapse");
    assert!(conn.exchange(), "the Service connection broke after GC");
    assert!(node.forwarded(ForwardPath::StackFlow).unwrap() > stack_before, "the replies skipped the stack");

    // The attack: a FIN and a RST in the connection's 4-tuple from the peer's side, let through
    // by the stack, mark nothing (10 s later the entry would lapse and the idle connection's
    // replies skip the stack).
    for (what, flags) in [("FIN", 0x11), ("RST", 0x04)] {
        peer_segment(node, &server_at, client_ip, conn.client_port(), flags);
        let flags = flow_flags(node, server_ip, client_ip);
        assert!(flags.iter().all(|f| f & (FLOW_FIN | FLOW_RST) == 0), "a peer's {what} shortened the entry: {flags:?}");
    }

    // The pod's own FIN (a graceful close): the entry holds as long as conntrack's TIME_WAIT.
    conn.server.shutdown(std::net::Shutdown::Both).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let flags = flow_flags(node, server_ip, client_ip);
    assert!(flags.iter().any(|f| f & FLOW_FIN != 0), "the pod's FIN did not mark the entry: {flags:?}");
    drop(conn);

    // The pod's own RST (an aborted connection): its entry lapses after conntrack's CLOSE time,
    // and so, two advances later, does the pod's mark.
    let mut conn = Connection::open(&client_ns, &listener);
    assert!(conn.exchange());
    socket2::SockRef::from(&conn.server).set_linger(Some(Duration::ZERO)).unwrap();
    let Connection { client: _client, server } = conn;
    drop(server);
    std::thread::sleep(Duration::from_millis(200));
    let flags = flow_flags(node, server_ip, client_ip);
    assert!(flags.iter().any(|f| f & FLOW_RST != 0), "the pod's RST did not mark the entry: {flags:?}");
    // The FIN-closed entry would hold 120 s: gone from FLOWS as the LRU would forget it.
    remove_flows(node, server_ip, client_ip, FLOW_FIN);
    std::thread::sleep(Duration::from_nanos(FLOW_TIMEOUT_TCP_RST_NS + 300_000_000));
    node.gc(&valid).unwrap();
    node.gc(&valid).unwrap();
    assert!(!marked(node, server_ip), "the pod's Service flows are gone and it is still marked");

    // Back on the fast path: the server's own connection to the client goes straight in.
    let fast_before = node.forwarded(ForwardPath::PodToPod).unwrap();
    let stack_before = node.forwarded(ForwardPath::StackFlow).unwrap();
    let seen = probe::ask_tcp(&server_ns, SocketAddrV4::new(client_ip, PORT + 1)).unwrap();
    assert_eq!(seen.ip(), std::net::IpAddr::V4(server_ip));
    assert!(node.forwarded(ForwardPath::PodToPod).unwrap() > fast_before, "no fast path after the mark lapsed");
    assert_eq!(node.forwarded(ForwardPath::StackFlow).unwrap(), stack_before, "a lapsed pod's packets took the stack");

    // And a new Service connection marks it again at once.
    let mut again = Connection::open(&client_ns, &listener);
    assert!(again.exchange(), "a Service connection after the lapse broke");
    assert!(marked(node, server_ip));
}

/// Removes the `FLOWS` entries of `server`'s replies to `client` that have `flag`.
fn remove_flows(tb: &Testbed, server: Ipv4Addr, client: Ipv4Addr, flag: u32) {
    let mut map: HashMap<_, FlowKey, FlowEntry> = HashMap::try_from(open(tb, "FLOWS")).unwrap();
    let (server, client) = (ebpf_common::ipv4_in_16(server.octets()), ebpf_common::ipv4_in_16(client.octets()));
    let keys: Vec<FlowKey> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, e)| k.protocol == 6 && k.src_addr == server && k.dst_addr == client && e.flags & flag != 0)
        .map(|(k, _)| k)
        .collect();
    for key in keys {
        map.remove(&key).unwrap();
    }
}
