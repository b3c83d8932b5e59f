//! Kubernetes Services over IPv6 with kube-proxy's rules (iptables mode through ip6tables-nft,
//! and nftables mode's `ip6 kube-proxy` table), as `services.rs` proves them for IPv4, on the
//! dual-stack single-NIC LAN topology (`ebpf_cni_tests::lan`): pod → ClusterIP (endpoint on
//! this node, on the other node, the client itself), node → ClusterIP, outside → NodePort,
//! pod → NodePort, and plain pod ↔ pod across nodes. IPv4 Services run beside them, to show
//! IPv4 is unchanged in a dual-stack cluster. Every flow asserts that its client completed,
//! answered by the very address it asked for, and, where the path decides it, which source the
//! server saw. Everything is run and the failures listed at the end.
//!
//! Not here: a pod's IPv6 masqueraded toward the outside (`crafted_packets6.rs` and the demo
//! cover it), and ebpf-cni's own Service LB over IPv6 (`services_own.rs`, `nodeport.rs`).
//! `EBPF_CNI_TESTS_POD_NETWORK=bridge` runs the same flows with the reference `bridge` plugin
//! networking the pods: the check that the flows themselves are right.
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ebpf_cni_tests::{
    flows::{self, Flow, Saw},
    kube_proxy::{self, Flavour, Protocol, Service},
    lan::{Ipv6Plan, LAN_HOST_V6, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan, LanPod, PodNetwork},
    probe::{self, Servers},
    traffic,
};

/// Ports every server listens on (pods, the host outside the cluster).
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;
/// The IPv6 ClusterIPs (from `fd00:10:96::/112`) of the `local`, `remote` and `self` Services.
const VIPS: [&str; 3] = ["fd00:10:96::101", "fd00:10:96::201", "fd00:10:96::301"];

#[test]
fn ipv6_service_flows_with_kube_proxy_iptables() {
    run_suite("ipv6_service_flows_with_kube_proxy_iptables", Flavour::Iptables, "s6i", 232);
}

#[test]
fn ipv6_service_flows_with_kube_proxy_nftables() {
    run_suite("ipv6_service_flows_with_kube_proxy_nftables", Flavour::Nftables, "s6n", 233);
}

/// Node 1: the client (also the endpoint of the `self` Services) and a server; node 2: a
/// server, also the client of the reverse flows.
struct World {
    client: LanPod,
    local: LanPod,
    remote: LanPod,
    _servers: Servers,
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address")
}

fn at(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

fn vip(service: usize, port: u16) -> SocketAddr {
    SocketAddr::new(ip(VIPS[service]), port)
}

fn v6(pod: &LanPod) -> Ipv6Addr {
    pod.ip6.expect("a dual-stack pod has an IPv6 address")
}

fn build(lan: &mut Lan, flavour: Flavour, cluster_cidrs: &str) -> anyhow::Result<World> {
    let client = lan.add_pod(0)?;
    let local = lan.add_pod(0)?;
    let remote = lan.add_pod(1)?;
    let mut servers = Servers::default();
    // On the pods' own addresses: an IPv6 wildcard socket would take the IPv4 port too.
    for pod in [&client, &local, &remote] {
        for ip in [IpAddr::V4(pod.ip), IpAddr::V6(v6(pod))] {
            servers.tcp(&pod.netns, (ip, TCP_PORT))?;
            servers.udp(&pod.netns, (ip, UDP_PORT))?;
        }
    }
    servers.tcp(&lan.host.name, (ip(LAN_HOST_V6), TCP_PORT))?;

    let (tcp, udp) = (|pod: &LanPod| (v6(pod), TCP_PORT), |pod: &LanPod| (v6(pod), UDP_PORT));
    let (tcp4, udp4) = (|pod: &LanPod| (pod.ip, TCP_PORT), |pod: &LanPod| (pod.ip, UDP_PORT));
    let services = [
        Service::new("default/local:http", Protocol::Tcp, vip(0, 80), &[tcp(&local)]).with_node_port(30080),
        Service::new("default/local:dns", Protocol::Udp, vip(0, 53), &[udp(&local)]),
        Service::new("default/remote:http", Protocol::Tcp, vip(1, 80), &[tcp(&remote)]).with_node_port(30081),
        Service::new("default/remote:dns", Protocol::Udp, vip(1, 53), &[udp(&remote)]),
        Service::new("default/self:http", Protocol::Tcp, vip(2, 80), &[tcp(&client)]).with_node_port(30082),
        Service::new("default/self:dns", Protocol::Udp, vip(2, 53), &[udp(&client)]),
        // The IPv4 halves of dual-stack Services, in the IPv4 proxier's rules.
        Service::new("default/local:http", Protocol::Tcp, at("10.96.1.1:80"), &[tcp4(&local)]),
        Service::new("default/remote:http", Protocol::Tcp, at("10.96.2.1:80"), &[tcp4(&remote)]),
        Service::new("default/remote:dns", Protocol::Udp, at("10.96.2.1:53"), &[udp4(&remote)]),
    ];
    for node in &lan.nodes {
        kube_proxy::install(&node.node.name, flavour, cluster_cidrs, &services)?;
    }
    Ok(World { client, local, remote, _servers: servers })
}

fn flows(lan: &Lan, w: &World) -> Vec<Flow> {
    use Protocol::{Tcp, Udp};
    use Saw::{Anything, Exactly};
    let (a, b, c) = (&w.client, &w.local, &w.remote);
    let (a6, b6, c6) = (IpAddr::V6(v6(a)), IpAddr::V6(v6(b)), IpAddr::V6(v6(c)));
    let (here, there, itself) = (ip(VIPS[0]), ip(VIPS[1]), ip(VIPS[2]));
    let (node1, node2, host) = (ip(LAN_NODE_IPV6S[0]), ip(LAN_NODE_IPV6S[1]), ip(LAN_HOST_V6));
    let (from_a, from_c, from_node1, from_host) = (&a.netns, &c.netns, &lan.nodes[0].node.name, &lan.host.name);
    let (t, u) = (TCP_PORT, UDP_PORT);
    let (a4, node1_v4) = (IpAddr::V4(a.ip), ip(LAN_NODE_IPS[0]));
    vec![
        // First, before any Service flagged the pods: pod → pod on this node straight in.
        Flow::new("IPv6 pod → pod, same node", from_a, Tcp, (b6, t), Exactly(a6)),
        Flow::new("IPv6 pod → pod on the other node", from_a, Tcp, (c6, t), Exactly(a6)),
        Flow::new("IPv6 pod → pod on the other node", from_a, Udp, (c6, u), Exactly(a6)),
        Flow::new("IPv6 pod → pod on the other node, from node 2", from_c, Tcp, (b6, t), Exactly(c6)),
        Flow::new("IPv6 pod → ClusterIP, endpoint on this node", from_a, Tcp, (here, 80), Exactly(a6)),
        Flow::new("IPv6 pod → ClusterIP, endpoint on this node", from_a, Udp, (here, 53), Exactly(a6)),
        Flow::new("IPv6 pod → ClusterIP, endpoint on the other node", from_a, Tcp, (there, 80), Exactly(a6)),
        Flow::new("IPv6 pod → ClusterIP, endpoint on the other node", from_a, Udp, (there, 53), Exactly(a6)),
        // kube-proxy masquerades a pod reaching itself (hairpin).
        Flow::new("IPv6 pod → ClusterIP, endpoint is the client itself", from_a, Tcp, (itself, 80), Anything),
        Flow::new("IPv6 pod → ClusterIP, endpoint is the client itself", from_a, Udp, (itself, 53), Anything),
        // kube-proxy masquerades sources outside the cluster CIDR (the node's own address).
        Flow::new("IPv6 node → ClusterIP, endpoint on this node", from_node1, Tcp, (here, 80), Anything),
        Flow::new("IPv6 node → ClusterIP, endpoint on the other node", from_node1, Tcp, (there, 80), Exactly(node1)),
        Flow::new("IPv6 node → ClusterIP, endpoint on the other node", from_node1, Udp, (there, 53), Exactly(node1)),
        // externalTrafficPolicy Cluster: NodePort traffic is masqueraded.
        Flow::new("IPv6 outside → NodePort, endpoint on this node", from_host, Tcp, (node1, 30080), Anything),
        Flow::new("IPv6 outside → NodePort, endpoint on node 2", from_host, Tcp, (node1, 30081), Exactly(node1)),
        Flow::new("IPv6 pod → NodePort, endpoint is the client (hairpin)", from_a, Tcp, (node1, 30082), Anything),
        Flow::new("IPv6 pod → NodePort of its node, endpoint on this node", from_a, Tcp, (node1, 30080), Anything),
        Flow::new("IPv6 pod → NodePort of the other node, endpoint there", from_a, Tcp, (node2, 30081), Anything),
        // Opened from outside the cluster (the host routes the pod subnets): never masqueraded.
        Flow::new("IPv6 outside → pod", from_host, Tcp, (b6, t), Exactly(host)),
        Flow::new("IPv6 outside → pod on node 2", from_host, Tcp, (c6, t), Exactly(host)),
        // After all that, plain pod ↔ pod still works, whichever way it now goes.
        Flow::new("IPv6 pod → pod, same node, after Services", from_a, Tcp, (b6, t), Exactly(a6)),
        Flow::new("IPv6 pod → pod, same node, after Services", from_a, Udp, (b6, u), Exactly(a6)),
        Flow::new("IPv6 pod → pod on the other node, after Services", from_c, Udp, (a6, u), Exactly(c6)),
        // IPv4 beside, unchanged.
        Flow::new("IPv4 pod → pod on the other node", from_a, Tcp, (c.ip, t), Exactly(a4)),
        Flow::new("IPv4 pod → ClusterIP, endpoint on this node", from_a, Tcp, at("10.96.1.1:80"), Exactly(a4)),
        Flow::new("IPv4 pod → ClusterIP, endpoint on the other node", from_a, Tcp, at("10.96.2.1:80"), Exactly(a4)),
        Flow::new("IPv4 pod → ClusterIP, endpoint on the other node", from_a, Udp, at("10.96.2.1:53"), Exactly(a4)),
        Flow::new(
            "IPv4 node → ClusterIP, endpoint on the other node",
            from_node1,
            Tcp,
            at("10.96.2.1:80"),
            Exactly(node1_v4),
        ),
    ]
}

/// After IPv6 Services, a pod still reaches the endpoint at its own address: a connection
/// reusing a Service connection's client port (straight to the endpoint) opens, and the
/// endpoint's port unreachable about such a direct flow arrives. (ebpf-cni sends these through
/// the stack now, the pods having been delivered Service flows: `ebpf/src/ipv6.rs`.)
fn after_a_service(w: &World) -> Vec<(&'static str, anyhow::Result<()>)> {
    let (a, b) = (w.client.netns.clone(), v6(&w.local));
    let reused = || traffic::ask_twice_from_one_port(&a, vip(0, 80), SocketAddr::new(b.into(), TCP_PORT));
    let refused = || probe::port_unreachable(&a, SocketAddr::new(b.into(), 9));
    vec![
        ("IPv6: a direct connection reusing a Service connection's client port", reused()),
        ("IPv6: port unreachable from a Service's endpoint, about a direct flow", refused()),
    ]
}

fn run_suite(test: &str, flavour: Flavour, tag: &str, octet: u16) {
    let cluster_cidr = format!("10.{octet}.0.0/16");
    let subnets = [format!("10.{octet}.1.0/24"), format!("10.{octet}.2.0/24")];
    let cluster_cidr6 = format!("fd00:10:{octet}::/56");
    let subnets6 = [format!("fd00:10:{octet}:1::/64"), format!("fd00:10:{octet}:2::/64")];
    let plan = Ipv6Plan { cluster_cidr: &cluster_cidr6, subnets: [&subnets6[0], &subnets6[1]] };
    let Some(mut lan) = Lan::for_test_dual_stack(test, tag, &cluster_cidr, [&subnets[0], &subnets[1]], plan) else {
        return;
    };
    let started = std::time::Instant::now();
    let cidrs = format!("{cluster_cidr},{cluster_cidr6}");
    let world = build(&mut lan, flavour, &cidrs).expect("pods, servers and kube-proxy's rules");
    let label = format!("[{flavour:?}]");
    let flows = flows(&lan, &world);
    let pod_to_pod_before = counted(&lan, ebpf_common::ForwardPath::PodToPod);
    let mut failures = flows::run_all(&label, &flows[..1]);
    let pod_to_pod = counted(&lan, ebpf_common::ForwardPath::PodToPod).saturating_sub(pod_to_pod_before);
    failures.extend(flows::run_all(&label, &flows[1..]));
    for (name, outcome) in after_a_service(&world) {
        flows::report(&label, name, outcome, &mut failures);
    }
    let mut checks = flows.len() + 2;
    if lan.pod_network == PodNetwork::EbpfCni {
        let datapath = datapath_checks(&lan, pod_to_pod);
        checks += datapath.len();
        for (name, outcome) in datapath {
            flows::report(&label, &name, outcome, &mut failures);
        }
    }
    println!("{test}: {checks} checks, {} failed, {:.1?}", failures.len(), started.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {checks} checks failed ({flavour:?} kube-proxy, pods by {:?}):\n  {}",
        failures.len(),
        lan.pod_network,
        failures.join("\n  ")
    );
}

/// Node 1's count of `path` (0 when there is no such counter: the bridge).
fn counted(lan: &Lan, path: ebpf_common::ForwardPath) -> u64 {
    lan.nodes[0].forwarded(path).unwrap_or(0)
}

/// The first IPv6 pod → pod flow took the fast path (no pod had been flagged yet), and no
/// node dropped anything the pods' IPv6 stacks sent as forged or unsupported.
fn datapath_checks(lan: &Lan, pod_to_pod: u64) -> Vec<(String, anyhow::Result<()>)> {
    use ebpf_common::DropReason::{SpoofedNeighbor, SpoofedSource, UnsupportedProtocol};
    let mut checks = vec![(
        "the first IPv6 pod → pod flow went straight into the pod".to_string(),
        if pod_to_pod > 0 { Ok(()) } else { Err(anyhow::anyhow!("nothing counted as pod-to-pod")) },
    )];
    for (i, node) in lan.nodes.iter().enumerate() {
        for reason in [SpoofedSource, UnsupportedProtocol, SpoofedNeighbor] {
            let count = node.drops(reason).unwrap_or(0);
            let outcome = if count == 0 { Ok(()) } else { Err(anyhow::anyhow!("{count} packets")) };
            checks.push((format!("node {}: no {} drops", i + 1, reason.name()), outcome));
        }
    }
    checks
}
