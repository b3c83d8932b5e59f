//! Issue 17: every Service path that works with `bridge` and kube-proxy works with ebpf-cni,
//! with kube-proxy's rules (iptables mode through iptables-nft, and nftables mode) written on
//! both nodes of the single-NIC LAN topology (`ebpf_cni_tests::lan`), conntrack's INVALID drop
//! included. Every flow asserts that its client completed, answered by the very address it asked
//! for (connected sockets), and, where the path decides it, which source the server saw. Then
//! packets to addresses of node 1's pod range that are no pod must not leave node 1 on the LAN.
//! Everything is run and the failures listed at the end, so one run shows the whole picture.
//!
//! `EBPF_CNI_TESTS_POD_NETWORK=bridge` runs the same flows with the reference `bridge` plugin
//! networking the pods: the check that the flows themselves are right.
use std::net::{Ipv4Addr, SocketAddrV4};

use ebpf_cni_tests::{
    EXT_SERVER,
    kube_proxy::{self, Flavour, Protocol, Service},
    lan::{LAN_HOST, LAN_NODE_IPS, LAN_NODE_PORTS, Lan, LanPod, PodNetwork},
    probe::{self, Servers},
    traffic::{self, PacketSocket, in_netns},
};

/// Ports every server listens on (pods, the host outside the cluster, the external server).
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;
/// The host's "API server", behind the `kubernetes` Service.
const HOST_API_PORT: u16 = 6443;
/// Node 1's host port (portmap) to the `local` pod's TCP server.
const HOST_PORT: u16 = 8081;

#[test]
fn service_flows_with_kube_proxy_iptables() {
    run_suite("service_flows_with_kube_proxy_iptables", Flavour::Iptables, "svi", 230);
}

#[test]
fn service_flows_with_kube_proxy_nftables() {
    run_suite("service_flows_with_kube_proxy_nftables", Flavour::Nftables, "svn", 231);
}

/// What a flow's server must have seen as the source.
#[derive(Clone, Copy)]
enum Saw {
    Exactly(Ipv4Addr),
    /// Any source: the path masquerades behind whichever node address faces the endpoint.
    Anything,
}

struct Flow {
    name: String,
    from: String,
    protocol: Protocol,
    to: SocketAddrV4,
    saw: Saw,
}

impl Flow {
    fn new(name: &str, from: &str, protocol: Protocol, to: SocketAddrV4, saw: Saw) -> Self {
        let kind = if protocol == Protocol::Tcp { "TCP" } else { "connected UDP" };
        Self { name: format!("{name} ({kind})"), from: from.to_string(), protocol, to, saw }
    }

    fn check(&self) -> anyhow::Result<()> {
        let seen = match self.protocol {
            Protocol::Tcp => probe::ask_tcp(&self.from, self.to)?,
            Protocol::Udp => probe::ask_udp(&self.from, self.to)?,
        };
        match self.saw {
            Saw::Exactly(expected) if seen.ip() != expected => {
                anyhow::bail!("answered, but the server saw {seen} instead of {expected}")
            }
            _ => Ok(()),
        }
    }
}

/// The pods, their servers and the Services in front of them.
struct World {
    /// Node 1: the client (also the endpoint of the `self` Services) and a server with a host port.
    client: LanPod,
    local: LanPod,
    /// Node 2: a server, also the client of the reverse flows.
    remote: LanPod,
    _servers: Servers,
}

fn addr(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("an IPv4 address")
}

fn build(lan: &mut Lan, flavour: Flavour, cluster_cidr: &str) -> anyhow::Result<World> {
    let client = lan.add_pod(0)?;
    let local = lan.add_pod_with_host_port(0, HOST_PORT, TCP_PORT)?;
    let remote = lan.add_pod(1)?;
    let mut servers = Servers::default();
    for pod in [&client, &local, &remote] {
        servers.tcp(&pod.netns, addr(Ipv4Addr::UNSPECIFIED, TCP_PORT))?;
        servers.udp(&pod.netns, addr(Ipv4Addr::UNSPECIFIED, UDP_PORT))?;
    }
    servers.tcp(&lan.host.name, addr(ip(LAN_HOST), HOST_API_PORT))?;
    servers.udp(&lan.host.name, addr(ip(LAN_HOST), UDP_PORT))?;
    servers.tcp(&lan.ext.name, addr(ip(EXT_SERVER), TCP_PORT))?;
    servers.udp(&lan.ext.name, addr(ip(EXT_SERVER), UDP_PORT))?;

    let (tcp, udp) = (|pod: &LanPod| addr(pod.ip, TCP_PORT), |pod: &LanPod| addr(pod.ip, UDP_PORT));
    let services = [
        Service::new("default/local:http", Protocol::Tcp, vip("10.96.1.1:80"), &[tcp(&local)]).with_node_port(30080),
        Service::new("default/local:dns", Protocol::Udp, vip("10.96.1.1:53"), &[udp(&local)]),
        Service::new("default/remote:http", Protocol::Tcp, vip("10.96.2.1:80"), &[tcp(&remote)]).with_node_port(30081),
        Service::new("default/remote:dns", Protocol::Udp, vip("10.96.2.1:53"), &[udp(&remote)]),
        // Like the `kubernetes` Service: its endpoint is a machine outside the cluster.
        Service::new(
            "default/kubernetes:https",
            Protocol::Tcp,
            vip("10.96.0.1:443"),
            &[addr(ip(LAN_HOST), HOST_API_PORT)],
        ),
        Service::new("default/outside:dns", Protocol::Udp, vip("10.96.0.2:53"), &[addr(ip(LAN_HOST), UDP_PORT)]),
        Service::new("default/self:http", Protocol::Tcp, vip("10.96.3.1:80"), &[tcp(&client)]).with_node_port(30082),
        Service::new("default/self:dns", Protocol::Udp, vip("10.96.3.1:53"), &[udp(&client)]),
        Service::new("kube-system/kube-dns:dns", Protocol::Udp, vip("10.96.0.10:53"), &[udp(&local), udp(&remote)]),
    ];
    for node in &lan.nodes {
        kube_proxy::install(&node.node.name, flavour, cluster_cidr, &services)?;
    }
    Ok(World { client, local, remote, _servers: servers })
}

fn flows(lan: &Lan, w: &World) -> Vec<Flow> {
    use Protocol::{Tcp, Udp};
    use Saw::{Anything, Exactly};
    let (a, b, c) = (&w.client, &w.local, &w.remote);
    let (node1, node2, host, ext) = (ip(LAN_NODE_IPS[0]), ip(LAN_NODE_IPS[1]), ip(LAN_HOST), ip(EXT_SERVER));
    // The clients: pods a (node 1) and c (node 2), node 1 itself, the host outside the cluster.
    let (from_a, from_c, from_node1, from_host) = (&a.netns, &c.netns, &lan.nodes[0].node.name, &lan.host.name);
    let mut flows = vec![
        Flow::new("pod → pod, same node", from_a, Tcp, addr(b.ip, TCP_PORT), Exactly(a.ip)),
        Flow::new("pod → pod on the other node", from_a, Tcp, addr(c.ip, TCP_PORT), Exactly(a.ip)),
        Flow::new("pod → pod on the other node, from node 2", from_c, Tcp, addr(b.ip, TCP_PORT), Exactly(c.ip)),
        Flow::new("pod → ClusterIP, endpoint on this node", from_a, Tcp, vip("10.96.1.1:80"), Exactly(a.ip)),
        Flow::new("pod → ClusterIP, endpoint on this node", from_a, Udp, vip("10.96.1.1:53"), Exactly(a.ip)),
        Flow::new("pod → ClusterIP, endpoint on the other node", from_a, Tcp, vip("10.96.2.1:80"), Exactly(a.ip)),
        Flow::new("pod → ClusterIP, endpoint on the other node", from_a, Udp, vip("10.96.2.1:53"), Exactly(a.ip)),
        // Masqueraded by ipMasq: the endpoint is outside the cluster.
        Flow::new("pod → ClusterIP, endpoint outside the cluster", from_a, Tcp, vip("10.96.0.1:443"), Exactly(node1)),
        Flow::new("pod → ClusterIP, endpoint outside the cluster", from_a, Udp, vip("10.96.0.2:53"), Exactly(node1)),
        // kube-proxy masquerades a pod reaching itself (hairpin).
        Flow::new("pod → ClusterIP, endpoint is the client itself", from_a, Tcp, vip("10.96.3.1:80"), Anything),
        Flow::new("pod → ClusterIP, endpoint is the client itself", from_a, Udp, vip("10.96.3.1:53"), Anything),
        // kube-proxy masquerades sources outside the cluster CIDR (the node's own address).
        Flow::new("node → ClusterIP, endpoint on this node", from_node1, Tcp, vip("10.96.1.1:80"), Anything),
        Flow::new("node → ClusterIP, endpoint on the other node", from_node1, Tcp, vip("10.96.2.1:80"), Exactly(node1)),
        Flow::new("node → ClusterIP, endpoint on the other node", from_node1, Udp, vip("10.96.2.1:53"), Exactly(node1)),
        // externalTrafficPolicy Cluster: NodePort traffic is masqueraded.
        Flow::new("outside → NodePort, endpoint on this node", from_host, Tcp, addr(node1, 30080), Anything),
        Flow::new("outside → NodePort, endpoint on the other node", from_host, Tcp, addr(node1, 30081), Exactly(node1)),
        Flow::new("pod → NodePort, endpoint is the client (hairpin)", from_a, Tcp, addr(node1, 30082), Anything),
        Flow::new("pod → NodePort of its node, endpoint on this node", from_a, Tcp, addr(node1, 30080), Anything),
        Flow::new("pod → NodePort of the other node, endpoint there", from_a, Tcp, addr(node2, 30081), Anything),
        // portmap DNATs without masquerading what comes from outside.
        Flow::new("outside → hostPort (portmap)", from_host, Tcp, addr(node1, HOST_PORT), Exactly(host)),
        Flow::new("pod → hostPort on its node (portmap)", from_a, Tcp, addr(node1, HOST_PORT), Anything),
        Flow::new("pod → outside, masqueraded", from_a, Tcp, addr(ext, TCP_PORT), Exactly(node1)),
        Flow::new("pod → outside, masqueraded", from_a, Udp, addr(ext, UDP_PORT), Exactly(node1)),
        Flow::new("pod on node 2 → outside, masqueraded", from_c, Tcp, addr(ext, TCP_PORT), Exactly(node2)),
        // Opened from outside the cluster: never masqueraded, the reply included.
        Flow::new("outside → pod", from_host, Tcp, addr(b.ip, TCP_PORT), Exactly(host)),
        Flow::new("outside → pod on node 2", from_host, Tcp, addr(c.ip, TCP_PORT), Exactly(host)),
    ];
    // kube-dns with an endpoint on each node: each query is a new flow, balanced at random.
    for query in 1..=6 {
        let name = format!("pod → DNS ClusterIP, endpoints on both nodes, query {query}");
        flows.push(Flow::new(&name, from_a, Udp, vip("10.96.0.10:53"), Exactly(a.ip)));
    }
    flows
}

fn vip(text: &str) -> SocketAddrV4 {
    text.parse().expect("a service address")
}

/// Packets to an address of node 1's pod range that no pod holds, or to the pods' gateway,
/// must stay on the node: nothing toward them may leave node 1 on the LAN. The same probe to
/// node 2's pod first shows that the sniffer sees what node 1 does send there.
fn leaks(lan: &Lan, w: &World, octet: u8) -> anyhow::Result<Vec<String>> {
    let sniffer = PacketSocket::open(&lan.lan.name, LAN_NODE_PORTS[0])?;
    let mac = lan.node_mac(0)?;
    let (unassigned, gateway) = (Ipv4Addr::new(10, octet, 1, 200), Ipv4Addr::new(10, octet, 1, 1));
    let sent_to = |from: &str, to: Ipv4Addr| -> anyhow::Result<usize> {
        sniffer.received();
        in_netns(from, move || {
            let socket = std::net::UdpSocket::bind(addr(Ipv4Addr::UNSPECIFIED, 0))?;
            for _ in 0..3 {
                let _ = socket.send_to(b"probe", addr(to, 9));
            }
            Ok(())
        })?;
        let _ = ebpf_cni_tests::run_in(from, "ping", &["-c", "1", "-W", "1", &to.to_string()]);
        Ok(probe::frames_toward(&sniffer.received(), mac, to))
    };
    anyhow::ensure!(sent_to(&w.client.netns, w.remote.ip)? > 0, "the sniffer missed a pod's packets to node 2");
    let mut failures = Vec::new();
    for (name, from, to) in [
        ("pod → an address of its node's pod range that no pod holds", &w.client.netns, unassigned),
        ("pod → its gateway address", &w.client.netns, gateway),
        ("outside → an address of node 1's pod range that no pod holds", &lan.host.name, unassigned),
    ] {
        let leaked = sent_to(from, to)?;
        if leaked > 0 {
            failures.push(format!("{name}: {leaked} frames toward {to} left node 1 on the LAN"));
        }
    }
    Ok(failures)
}

fn run_suite(test: &str, flavour: Flavour, tag: &str, octet: u8) {
    let cluster_cidr = format!("10.{octet}.0.0/16");
    let subnets = [format!("10.{octet}.1.0/24"), format!("10.{octet}.2.0/24")];
    let Some(mut lan) = Lan::for_test(test, tag, &cluster_cidr, [&subnets[0], &subnets[1]]) else {
        return;
    };
    let started = std::time::Instant::now();
    let world = build(&mut lan, flavour, &cluster_cidr).expect("pods, servers and kube-proxy's rules");
    let flows = flows(&lan, &world);
    let mut failures = Vec::new();
    for flow in &flows {
        let outcome = flow.check();
        println!(
            "[{flavour:?}] {:<4} {}{}",
            if outcome.is_ok() { "ok" } else { "FAIL" },
            flow.name,
            fmt_error(&outcome)
        );
        if let Err(e) = outcome {
            failures.push(format!("{}: {e:#}", flow.name));
        }
    }
    for (name, outcome) in after_a_service(&world) {
        println!("[{flavour:?}] {:<4} {name}{}", if outcome.is_ok() { "ok" } else { "FAIL" }, fmt_error(&outcome));
        if let Err(e) = outcome {
            failures.push(format!("{name}: {e:#}"));
        }
    }
    let leaked = leaks(&lan, &world, octet).expect("sniffing the LAN");
    for failure in &leaked {
        println!("[{flavour:?}] FAIL {failure}");
    }
    failures.extend(leaked);
    if lan.pod_network == PodNetwork::EbpfCni {
        failures.extend(paths_taken(&lan, flavour));
    }
    let checks = flows.len() + 5;
    println!("{test}: {checks} checks, {} failed, {:.1?}", failures.len(), started.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {checks} checks failed ({flavour:?} kube-proxy, pods by {:?}):\n  {}",
        failures.len(),
        lan.pod_network,
        failures.join("\n  ")
    );
}

fn fmt_error(outcome: &anyhow::Result<()>) -> String {
    outcome.as_ref().err().map(|e| format!(": {e:#}")).unwrap_or_default()
}

/// The flows above took the paths docs/architecture.md describes: the fast ones where the stack never
/// handled a flow (pod ↔ pod, across nodes through the uplink), the stack for flows it
/// translated, and the counters say so. Lists what was never counted.
fn paths_taken(lan: &Lan, flavour: Flavour) -> Vec<String> {
    use ebpf_common::{DropReason, ForwardPath::*};
    let mut missing = Vec::new();
    for (node, path, why) in [
        (0, PodToPod, "pod → pod on this node, straight in"),
        (0, ToOtherNode, "pod → another node's pod, straight out of the uplink"),
        (1, FromOtherNode, "another node's pod → pod, straight in from the uplink"),
        (0, StackFlow, "a local Service endpoint's replies, through the stack"),
        (0, UplinkToStack, "a remote Service endpoint's replies and the outside, through the stack"),
        (0, Masqueraded, "pod → outside"),
        (0, ReplyToPod, "masquerade's replies, translated back"),
        (0, NotMasqueraded, "a pod's replies to the outside's flows"),
    ] {
        let count = lan.nodes[node].forwarded(path).unwrap_or(0);
        println!("[{flavour:?}] node {} {:<16} {count}", node + 1, path.name());
        if count == 0 {
            missing.push(format!("node {}: nothing counted as {} ({why})", node + 1, path.name()));
        }
    }
    if lan.nodes[0].drops(DropReason::NotAPod).unwrap_or(0) == 0 {
        missing.push("node 1: nothing counted as not-a-pod (the leak probes)".into());
    }
    missing
}

/// A pod that served a Service (its replies went back through the stack) still talks directly:
/// a connection that reuses a Service connection's addresses and ports (the same client port,
/// straight to the endpoint) opens, and an ICMP error it sends about a direct flow arrives
/// (conntrack never saw that flow, so through the stack it would be INVALID and dropped).
fn after_a_service(w: &World) -> Vec<(&'static str, anyhow::Result<()>)> {
    let (a, b) = (&w.client, &w.local);
    let reused = || traffic::ask_twice_from_one_port(&a.netns, vip("10.96.1.1:80").into(), addr(b.ip, TCP_PORT).into());
    let refused = || probe::port_unreachable(&a.netns, addr(b.ip, 9).into());
    vec![
        ("a direct connection reusing a Service connection's client port", reused()),
        ("port unreachable from a Service's endpoint, about a direct flow", refused()),
    ]
}
