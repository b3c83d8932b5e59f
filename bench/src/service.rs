//! Pod → ClusterIP → pod on one node: the client pod dials a Service's ClusterIP, and the rules
//! kube-proxy writes in iptables mode (`ebpf_cni_tests::kube_proxy`, the same rules on both
//! nodes) DNAT it to the server pod. ebpf-cni hands a packet to a ClusterIP to the node's stack,
//! where the rules apply; bridge routes it through `cni0`, and its node has
//! `bridge-nf-call-iptables` on, as kube-proxy requires, so that conntrack un-DNATs the server's
//! replies, which the bridge switches straight back to the client. Every connection is a new
//! conntrack entry on both: the connection rate measures that.
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, bail};
use ebpf_cni_tests::{
    Plugin,
    kube_proxy::{self, Flavour, Protocol, Service},
    run_in,
    traffic::{in_netns, tcp_listener},
};

use crate::{
    Settings, conn_rate, iperf,
    iperf::Placement,
    report::{Better::*, Figure},
    sockperf,
    topology::{self, Family, Pair, Path},
};

const SECTION: &str = "pod → ClusterIP → pod";
const SPLIT: Placement = Placement { client_cpu: Some(0), server_cpu: Some(1) };
/// Client and server of the latency runs share this CPU, as in the pod → pod section.
const LATENCY_CPU: usize = 1;
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// kube-proxy's `--cluster-cidr`: the pods of both test nodes are in it.
const CLUSTER_CIDR: &str = "10.242.0.0/16";
const CONN_PORT: u16 = 5302;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let bridge = Some(Path::Bridge);
    let mut tcp = Figure::new(SECTION, "TCP, 1 stream (CPUs 0→1)", "Gbit/s", Higher).target(bridge, 1.0);
    let mut retr = Figure::new(SECTION, "TCP retransmits, 1 stream", "per run", Lower);
    let mut udp = Figure::new(SECTION, "UDP 64 B received (CPUs 0→1)", "kpps", Higher).target(bridge, 1.0);
    let mut tcp_rtt = Figure::new(SECTION, "TCP ping-pong RTT p50 (same CPU)", "µs", Lower).target(bridge, 1.0);
    let mut udp_rtt = Figure::new(SECTION, "UDP ping-pong RTT p50 (same CPU)", "µs", Lower).target(bridge, 1.0);
    let mut conns = Figure::new(SECTION, "TCP connections, one at a time", "conn/s", Higher).target(bridge, 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::PLUGINS, round) {
            let pair = through_cluster_ip(path, ours)?;
            connects(&pair, path)?;
            let one = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
            let small = iperf::udp(&pair, s.seconds, 64, SPLIT)?;
            let tcp_pp = sockperf::ping_pong(&pair, sockperf::Protocol::Tcp, s.latency_seconds, LATENCY_CPU)?;
            let udp_pp = sockperf::ping_pong(&pair, sockperf::Protocol::Udp, s.latency_seconds, LATENCY_CPU)?;
            let server: Ipv4Addr = pair.server_ip.parse()?;
            let (listen, dial) = (SocketAddrV4::new(server, CONN_PORT), SocketAddrV4::new(CLUSTER_IP, CONN_PORT));
            let rate = conn_rate::per_second(&pair.client_ns, &pair.server_ns, listen, dial, s.latency_seconds)?;
            eprintln!(
                "ClusterIP round {round} {:8}: TCP {:.2} Gbit/s ({} retr), UDP {:.0} kpps, RTT TCP {:.1} µs, \
                 UDP {:.1} µs, {:.0} conn/s",
                path.name(),
                one.gbits,
                one.retransmits,
                small.pps / 1e3,
                tcp_pp.p50_us,
                udp_pp.p50_us,
                rate
            );
            tcp.record(path, one.gbits);
            retr.record(path, one.retransmits as f64);
            udp.record(path, small.pps / 1e3);
            tcp_rtt.record(path, tcp_pp.p50_us);
            udp_rtt.record(path, udp_pp.p50_us);
            conns.record(path, rate);
        }
    }
    Ok(vec![tcp, retr, udp, tcp_rtt, udp_rtt, conns])
}

/// Two pods on a fresh node of `path`'s plugin, kube-proxy's rules for a Service in front of
/// the second one, and clients that dial the Service.
fn through_cluster_ip(path: Path, ours: &Plugin) -> Result<Pair> {
    let pair = topology::build(path, ours, Family::V4)?;
    let node = &pair.node().context("a CNI path has a node")?.node.name;
    // A packet to a ClusterIP is routed by the node once kube-proxy's DNAT gave it a pod's
    // address: forwarding must be on, as on every Kubernetes node.
    run_in(node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    if path == Path::Bridge {
        run_in(node, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
    }
    let server: Ipv4Addr = pair.server_ip.parse()?;
    kube_proxy::install(node, Flavour::Iptables, CLUSTER_CIDR, &services(server))?;
    Ok(pair.dialling(&CLUSTER_IP.to_string()))
}

/// One connection through the ClusterIP, with a short timeout: a path whose replies skip
/// conntrack's un-DNAT (they reach the client from the pod's address, not the ClusterIP)
/// never connects, and saying so beats iperf3's own timeout.
fn connects(pair: &Pair, path: Path) -> Result<()> {
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let listener = tcp_listener(&pair.server_ns, SocketAddrV4::new(server, CONN_PORT))?;
    let dial = SocketAddrV4::new(CLUSTER_IP, CONN_PORT);
    let timeout = std::time::Duration::from_secs(2);
    let connected = in_netns(&pair.client_ns, move || Ok(std::net::TcpStream::connect_timeout(&dial.into(), timeout)))?;
    drop(listener);
    if let Err(e) = connected {
        bail!(
            "{}: pod → ClusterIP → pod does not connect ({dial} → {server}: {e}); the replies must go back \
             through the node's conntrack to be un-DNATed",
            path.name()
        );
    }
    Ok(())
}

/// One Service port per protocol and port the measurements use, each with the server pod as
/// its only endpoint: iperf3 (its TCP control connection and UDP data), sockperf, and the
/// connection-rate server.
fn services(server: Ipv4Addr) -> Vec<Service> {
    let ports = [
        ("iperf", Protocol::Tcp, iperf::PORT),
        ("iperf-udp", Protocol::Udp, iperf::PORT),
        ("sockperf", Protocol::Tcp, sockperf::PORT),
        ("sockperf-udp", Protocol::Udp, sockperf::PORT),
        ("connect", Protocol::Tcp, CONN_PORT),
    ];
    ports
        .into_iter()
        .map(|(name, protocol, port)| {
            let endpoint = SocketAddrV4::new(server, port);
            Service::new(&format!("bench/server:{name}"), protocol, SocketAddrV4::new(CLUSTER_IP, port), &[endpoint])
        })
        .collect()
}
