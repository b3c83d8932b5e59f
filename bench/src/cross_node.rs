//! Pod → pod across two nodes (`two_nodes.rs`): ebpf-cni, bridge with host-gw routes, the two
//! bare node namespaces over the same wire (the ceiling), and two namespaces routed through a
//! third with no plugin at all (what the two veths and one forwarding hop cost by themselves),
//! every path built fresh in every round, the order rotating. Throughput (1 and 4 TCP streams), retransmits, 64-byte UDP packets
//! per second, ping-pong round trips, new connections per second, and the CPU the machine spent
//! per GB moved; placements as in the pod → pod section. After each ebpf-cni measurement, its
//! counters must show the fast path taken: node 1's packets out of the wire by the FIB redirect,
//! node 2's straight into the pod, the nodes' stacks forwarding next to nothing. And the cost of
//! ebpf-cni's two programs on this path per packet (`BPF_PROG_TEST_RUN` on the pinned programs,
//! a TCP ACK from the client pod to the server pod): `from_pod` on node 1 (lookups, FIB lookup,
//! redirect out of the wire) and `from_uplink` on node 2 (lookups, redirect into the pod).
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    Plugin, Testbed,
    frames::{ethernet, ipv4, tcp, with_checksums},
    lan::link_mac,
    prog_run::TC_ACT_REDIRECT,
    run_in,
};
use ebpf_common::{
    ForwardPath,
    names::{FROM_POD, FROM_UPLINK},
};

use crate::{
    Settings, conn_rate, iperf,
    iperf::{FREE, SPLIT},
    prog_cost::{self, Runs},
    report::{Better::*, Figure},
    sockperf::{self, LATENCY_CPU, Protocol},
    throughput::Throughput,
    topology::{self, Pair, Path},
    two_nodes,
};

const SECTION: &str = "pod → pod, across nodes";
const PATHS: [Path; 4] = [Path::EbpfCni, Path::Bridge, Path::BareNodes, Path::Routed];
const CONN_PORT: u16 = 5302;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let (bridge, bare, routed) = (Some(Path::Bridge), Some(Path::BareNodes), Some(Path::Routed));
    // The table shows this section's own paths: bare veth and loopback are same-node ceilings.
    let figure = |name: &str, unit, better| Figure::new(SECTION, name, unit, better).own_columns();
    let latency = |name: &str| figure(name, "µs", Lower).target(bare, 1.05).target(bridge, 1.0);
    // The median within 5 % of one forwarding hop with no plugin: ebpf-cni adds next to nothing.
    let median_latency = |name: &str| latency(name).target(routed, 1.05);
    let mut throughput = Throughput::new(figure, |f| f.target(bare, 0.95).target(bridge, 1.0));
    let mut lat = [
        median_latency("TCP ping-pong RTT p50 (same CPU)"),
        latency("TCP ping-pong RTT p99 (same CPU)"),
        median_latency("UDP ping-pong RTT p50 (same CPU)"),
        latency("UDP ping-pong RTT p99 (same CPU)"),
    ];
    let mut conns = figure("TCP connections, one at a time", "conn/s", Higher).target(bridge, 1.0);
    let mut cpu = figure("CPU per GB, TCP 1 stream", "CPU s/GB", Lower).target(bridge, 1.0);
    let mut out_cost = figure("ebpf-cni per packet: from_pod, out of the wire (node 1)", "ns", Lower);
    let mut in_cost = figure("ebpf-cni per packet: from_uplink, into the pod (node 2)", "ns", Lower);
    let runs = Runs { repeat: s.prog_runs, singles: (s.prog_runs / 200).max(20) as usize };
    for round in 0..s.rounds {
        for path in topology::rotated(PATHS, round) {
            let pair = two_nodes::build(path, ours)?;
            let before = fast_path(path, &pair)?;
            let one = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
            let four = iperf::tcp(&pair, s.seconds, 4, FREE, false)?;
            let small = iperf::udp(&pair, s.seconds, 64, SPLIT)?;
            let tcp = sockperf::ping_pong(&pair, Protocol::Tcp, s.latency_seconds, LATENCY_CPU)?;
            let udp_rtt = sockperf::ping_pong(&pair, Protocol::Udp, s.latency_seconds, LATENCY_CPU)?;
            let server = SocketAddrV4::new(pair.server_ip.parse()?, CONN_PORT);
            let rate = conn_rate::per_second(&pair.client_ns, &pair.server_ns, server, server, s.latency_seconds)?;
            let taken = match (before, fast_path(path, &pair)?) {
                (Some(before), Some(after)) => checked(before, after)?,
                _ => String::new(),
            };
            let rtts = [tcp.p50_us, tcp.p99_us, udp_rtt.p50_us, udp_rtt.p99_us];
            eprintln!(
                "across nodes round {round} {:25}: TCP {:.2} Gbit/s ({} retr), 4 streams {:.2} ({} retr), \
                 UDP {:.0} kpps ({:.1}% lost), RTT {:.1?} µs, {rate:.0} conn/s, {:.2} CPU s/GB{taken}",
                path.name(),
                one.gbits,
                one.retransmits,
                four.gbits,
                four.retransmits,
                small.pps / 1e3,
                small.loss_percent,
                rtts,
                one.cpu_s_per_gb,
            );
            throughput.record(path, &one, Some(&four), &small);
            for (figure, value) in lat.iter_mut().zip(rtts) {
                figure.record(path, value);
            }
            conns.record(path, rate);
            cpu.record(path, one.cpu_s_per_gb);
            if let Some(nodes) = pair.nodes().filter(|_| path == Path::EbpfCni) {
                let (out, into) = program_costs(nodes, &pair, runs)?;
                eprintln!(
                    "across nodes round {round} ebpf-cni per packet: from_pod {out:.0} ns, from_uplink {into:.0} ns"
                );
                out_cost.record(path, out);
                in_cost.record(path, into);
            }
        }
    }
    let mut figures = throughput.figures(true);
    figures.extend(lat);
    figures.extend([conns, cpu, out_cost, in_cost]);
    Ok(figures)
}

/// `from_pod`'s and `from_uplink`'s cost, ns, on the client pod's TCP ACK to the server pod,
/// each checked to redirect it (after the measurements: the wire's neighbours are resolved).
fn program_costs(nodes: &[Testbed; 2], pair: &Pair, runs: Runs) -> Result<(f64, f64)> {
    let (client, server) = (pod_address(&pair.client_ns)?, pair.server_ip.parse::<Ipv4Addr>()?);
    let host_veth = nodes[0].host_veths()?.into_iter().next().context("no host veth on node 1")?;
    let ack = |dst_mac, src_mac| {
        with_checksums([ethernet(dst_mac, src_mac, 0x0800), ipv4(client, server, 6, &tcp(40_000, 8080, ACK))].concat())
    };
    let sent = ack(link_mac(&nodes[0].node.name, &host_veth)?, link_mac(&pair.client_ns, "eth0")?);
    let out = prog_cost::redirect_cost(&nodes[0], FROM_POD, &host_veth, &sent, runs)?;
    let wire = |node: &Testbed| link_mac(&node.node.name, "eth0");
    let arrived = ack(wire(&nodes[1])?, wire(&nodes[0])?);
    let into = prog_cost::redirect_cost(&nodes[1], FROM_UPLINK, "eth0", &arrived, runs)?;
    for (program, timed) in [(FROM_POD, &out), (FROM_UPLINK, &into)] {
        ensure!(timed.verdict == TC_ACT_REDIRECT, "{program}: verdict {} on the cross-node ACK", timed.verdict);
    }
    Ok((out.ns, into.ns))
}

const ACK: u8 = 0x10;

/// The IPv4 address on `eth0` in `netns`.
fn pod_address(netns: &str) -> Result<Ipv4Addr> {
    let out = run_in(netns, "ip", &["-4", "-o", "addr", "show", "dev", "eth0"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let cidr = text.split_whitespace().skip_while(|w| *w != "inet").nth(1).context("no IPv4 address on eth0")?;
    Ok(cidr.split('/').next().unwrap_or_default().parse()?)
}

/// What ebpf-cni's nodes counted so far: node 1's packets out of the wire by the FIB redirect,
/// node 2's from the wire straight into its pod, and what the two stacks forwarded.
#[derive(Clone, Copy)]
struct Counts {
    redirected: u64,
    delivered: u64,
    kernel: u64,
}

fn fast_path(path: Path, pair: &Pair) -> Result<Option<Counts>> {
    let Some([node1, node2]) = pair.nodes().filter(|_| path == Path::EbpfCni) else { return Ok(None) };
    Ok(Some(Counts {
        redirected: node1.forwarded(ForwardPath::ToOtherNode)?,
        delivered: node2.forwarded(ForwardPath::FromOtherNode)?,
        kernel: node1.kernel_forwarded()? + node2.kernel_forwarded()?,
    }))
}

/// The measurements went by the fast path: most packets both ways, the stacks a handful (the
/// first packets, before the neighbour entry is there, and what the FIB leaves to them).
fn checked(before: Counts, after: Counts) -> Result<String> {
    let (redirected, delivered) = (after.redirected - before.redirected, after.delivered - before.delivered);
    let kernel = after.kernel - before.kernel;
    ensure!(
        redirected > 0 && delivered > 0 && kernel * 100 < redirected + delivered,
        "ebpf-cni across nodes did not take its fast path: {redirected} packets redirected out of node 1, \
         {delivered} delivered from the wire on node 2, {kernel} forwarded by the nodes' stacks"
    );
    Ok(format!("; fast path: {redirected} out of node 1, {delivered} into the pod on node 2, {kernel} by the stacks"))
}
