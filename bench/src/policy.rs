//! NetworkPolicy's cost to the traffic it allows, on one node, ebpf-cni only: pod → pod and
//! pod → ClusterIP → pod (the socket LB, kubeProxyReplacement on, as in the Service section),
//! each with no policy and with 1,000 (`policy_set.rs`: every pod of the measured pair's
//! namespace isolated both ways, hundreds of policies allowing the measured flows, the rest
//! selecting pods of other namespaces), written with `ebpf-cni policy-set`. Each round builds a
//! fresh node per state, all of them before measuring, and measures them by turns
//! ([`measure_by_turns`]), the order rotating from round to round. Figures: TCP ping-pong p50
//! and p99 and new connections per second, client and server on one CPU for both (left to
//! the scheduler, connections per second moved ±5 % from run to run with where it put them),
//! 1,000 policies ÷ none, and `from_pod`'s own time per packet of an established flow
//! (`policy_cost.rs`), which the round trips' noise cannot hide, and on the connections' live
//! traffic (`live_cost.rs`), cold caches and all. The policy node is also measured with its
//! policies and with them taken away, by turns on that one node (`measure_toggled`): the two
//! nodes' placements then play no part in the ratio. With `--previous BINARY`, the
//! previous release's node (no policy) is measured in the same rounds: the no-policy figures
//! of this build ÷ it, the standing rule that allowed traffic without policy does not move.
//! Then `policy_sync.rs`: a policy change and a pod label change → the datapath's verdict.
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{Plugin, traffic::in_netns};

use crate::{
    Settings, conn_rate, live_cost, policy_cost,
    policy_set::{self, CLOSED_PORT, Cluster},
    policy_sync,
    report::{Better::*, Figure},
    service_set::{self, CLUSTER_IP, CONN_PORT},
    sockperf::{self, LATENCY_CPU},
    topology::{self, Pair, Path},
};

/// The two flows measured, by where the client dials.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    PodToPod,
    ClusterIp,
}

impl Flow {
    fn name(self) -> &'static str {
        match self {
            Flow::PodToPod => "pod → pod",
            Flow::ClusterIp => "pod → ClusterIP → pod",
        }
    }

    /// The section of the figures measured on the policy node with its policies and without.
    fn toggled_section(self) -> &'static str {
        match self {
            Flow::PodToPod => "pod → pod, 1,000 NetworkPolicies on and off, one node",
            Flow::ClusterIp => "pod → ClusterIP → pod, 1,000 NetworkPolicies on and off, one node",
        }
    }

    fn section(self, policies: bool) -> &'static str {
        match (self, policies) {
            (Flow::PodToPod, true) => "pod → pod, 1,000 NetworkPolicies",
            (Flow::ClusterIp, true) => "pod → ClusterIP → pod, 1,000 NetworkPolicies",
            (Flow::PodToPod, false) => "pod → pod, no NetworkPolicy",
            (Flow::ClusterIp, false) => "pod → ClusterIP → pod, no NetworkPolicy",
        }
    }
}

/// One flow's figures: with policies against none (`EbpfCni` = 1,000 policies, `NoPolicy`),
/// when the build has NetworkPolicy; and without policy (`EbpfCni` = this build, `Previous`).
/// Values in the order of [`measure`]'s: p50, p99, conn/s, and for pod → pod `from_pod`'s ns
/// (an ACK, a SYN; on live traffic a packet, a connection).
struct Figures {
    policies: Option<Vec<Figure>>,
    none: Vec<Figure>,
    /// Ping-pong p50 and connections/s on the policy node, its policies on (`EbpfCni`) and off
    /// (`NoPolicy`): [`measure_toggled`].
    toggled: Option<Vec<Figure>>,
}

impl Figures {
    fn new(flow: Flow, policies: bool) -> Self {
        let make = |policies: bool| {
            let against = Some(if policies { Path::NoPolicy } else { Path::Previous });
            let section = flow.section(policies);
            let mut all = vec![
                Figure::new(section, "TCP ping-pong RTT p50 (same CPU)", "µs", Lower).target(against, 1.03),
                Figure::new(section, "TCP ping-pong RTT p99 (same CPU)", "µs", Lower),
                Figure::new(section, "TCP connections, one at a time (same CPU)", "conn/s", Higher)
                    .target(against, 0.97),
            ];
            if flow == Flow::PodToPod {
                let name = "from_pod per packet, an established flow's ACK (BPF_PROG_TEST_RUN)";
                all.push(Figure::new(section, name, "ns", Lower));
                let name = "from_pod per packet, a new connection's SYN (BPF_PROG_TEST_RUN)";
                all.push(Figure::new(section, name, "ns", Lower));
                let name = "from_pod per packet of the connections (live, bpf_stats)";
                all.push(Figure::new(section, name, "ns", Lower));
                let name = "from_pod per connection, all its packets (live, bpf_stats)";
                all.push(Figure::new(section, name, "ns", Lower));
            }
            all.into_iter().map(Figure::own_columns).collect::<Vec<_>>()
        };
        let toggled = || {
            let section = flow.toggled_section();
            [
                Figure::new(section, "TCP ping-pong RTT p50 (same CPU)", "µs", Lower),
                Figure::new(section, "TCP connections, one at a time (same CPU)", "conn/s", Higher),
            ]
            .into_iter()
            .map(Figure::own_columns)
            .collect()
        };
        Self { policies: policies.then(|| make(true)), none: make(false), toggled: policies.then(toggled) }
    }

    /// The policy node's [`measure_toggled`] values: `[on, off]`, each `[p50, conn/s]`.
    fn record_toggled(&mut self, values: [[f64; 2]; 2]) {
        if let Some(figures) = &mut self.toggled {
            for (column, values) in [Path::EbpfCni, Path::NoPolicy].into_iter().zip(values) {
                for (figure, value) in figures.iter_mut().zip(values) {
                    figure.record(column, value);
                }
            }
        }
    }

    /// `state`'s values: 1,000 policies (`EbpfCni`), this build without policy (`NoPolicy`),
    /// the previous release (`Previous`).
    fn record(&mut self, state: Path, values: &[f64]) {
        let put = |figures: &mut Vec<Figure>, column: Path| {
            for (figure, value) in figures.iter_mut().zip(values) {
                figure.record(column, *value);
            }
        };
        if let Some(with) = &mut self.policies
            && state != Path::Previous
        {
            put(with, state);
        }
        match state {
            Path::NoPolicy => put(&mut self.none, Path::EbpfCni),
            Path::Previous => put(&mut self.none, Path::Previous),
            _ => {}
        }
    }

    /// With policies (against a node without, then on and off on one node); without, when
    /// `without` (against the previous release, or alone for a build without NetworkPolicy).
    fn split(self, without: bool) -> (Vec<Figure>, Vec<Figure>) {
        let none = if without { self.none } else { Vec::new() };
        let with = self.policies.into_iter().chain(self.toggled).flatten().collect();
        (with, none)
    }
}

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let previous = s.previous.as_ref();
    let enforces = policy_set::supported(ours);
    if !enforces {
        eprintln!("{} has no NetworkPolicy (no policy-set): measuring without policy only", ours.binary.display());
    }
    let mut flows = [Flow::PodToPod, Flow::ClusterIp].map(|flow| (flow, Figures::new(flow, enforces)));
    let mut sync = enforces.then(|| policy_sync::Figures::new(s.policies));
    let states: Vec<Path> = [Path::EbpfCni, Path::NoPolicy]
        .into_iter()
        .filter(|p| enforces || *p != Path::EbpfCni)
        .chain(previous.map(|_| Path::Previous))
        .collect();
    for round in 0..s.rounds {
        let mut order = states.clone();
        order.rotate_left(round % states.len());
        // Every state's node at once, measured by turns (`measure_by_turns`): the machine's
        // drift over a round lands on all of them alike, not on whichever came last.
        let mut nodes = Vec::new();
        for state in order {
            let plugin = if state == Path::Previous { previous.context("--previous")? } else { ours };
            let policies = if state == Path::EbpfCni { s.policies } else { 0 };
            nodes.push((state, node(plugin, policies)?));
        }
        for (flow, figures) in &mut flows {
            let measured = measure_by_turns(s, &mut nodes, *flow)?;
            for ((state, pair), mut values) in nodes.iter().zip(measured) {
                if *flow == Flow::PodToPod {
                    values.push(policy_cost::from_pod_ack(pair)?);
                    values.push(policy_cost::from_pod_syn(pair)?);
                    let listen = SocketAddrV4::new(pair.server_ip.parse()?, CONN_PORT);
                    let (per_run, per_connection) = live_cost::from_pod_per_connection(pair, listen)?;
                    values.extend([per_run, per_connection]);
                }
                let per_packet = match values.get(3..7) {
                    Some([ack, syn, live, connection]) => format!(
                        ", from_pod ACK {ack:.0} ns, SYN {syn:.0} ns, live {live:.0} ns a packet, {connection:.0} ns a connection"
                    ),
                    _ => String::new(),
                };
                eprintln!(
                    "policy round {round} {:20} {:22}: TCP RTT p50 {:.1} µs, p99 {:.1} µs, {:.0} conn/s{per_packet}",
                    state.name(),
                    flow.name(),
                    values[0],
                    values[1],
                    values[2],
                );
                figures.record(*state, &values);
            }
            if let Some((_, pair)) = nodes.iter_mut().find(|(state, _)| *state == Path::EbpfCni) {
                let [on, off] = measure_toggled(s, pair, *flow, s.policies)?;
                eprintln!(
                    "policy round {round} one node, policies on / off {:22}: TCP RTT p50 {:.1} / {:.1} µs, {:.0} / {:.0} conn/s",
                    flow.name(),
                    on[0],
                    off[0],
                    on[1],
                    off[1],
                );
                figures.record_toggled([on, off]);
            }
        }
        drop(nodes);
        if let Some(sync) = &mut sync {
            let changes = policy_sync::measure(ours, s.policies, s.policy_changes)?;
            eprintln!("policy round {round}: {}", changes.summary());
            sync.record(&changes);
        }
    }
    // Every flow with policies, then every flow without (the tables' order), then the changes.
    let (with, without): (Vec<_>, Vec<_>) =
        flows.into_iter().map(|(_, f)| f.split(previous.is_some() || !enforces)).unzip();
    let mut figures: Vec<Figure> = with.into_iter().chain(without).flatten().collect();
    figures.extend(sync.into_iter().flat_map(policy_sync::Figures::figures));
    Ok(figures)
}

/// A fresh node of `plugin` with the socket LB, the client and server pods, the measured
/// Services in front of the server and, when `policies` > 0, that many NetworkPolicies; a
/// pair whose clients dial the server itself.
pub fn node(plugin: &Plugin, policies: usize) -> Result<Pair> {
    let pair = topology::build_socket_lb(plugin)?;
    let tb = pair.node().context("a CNI path has a node")?;
    let server: Ipv4Addr = pair.server_ip.parse()?;
    service_set::write_to_maps(tb, &service_set::services(1, server))?;
    if policies > 0 {
        let client = client_ip(&pair)?;
        policy_set::write_to_maps(tb, &Cluster { client, server, node: "node-1" }, policies)?;
        // Measuring a node that enforces nothing would flatter it: a port no policy allows
        // must be closed, while the measured one connects.
        ensure!(
            connects(&pair.client_ns, SocketAddrV4::new(server, CONN_PORT), &pair.server_ns)?,
            "policies deny the measured flow"
        );
        ensure!(
            !connects(&pair.client_ns, SocketAddrV4::new(server, CLOSED_PORT), &pair.server_ns)?,
            "with {policies} policies a port none allows still connects: nothing is enforced"
        );
    }
    Ok(pair)
}

/// The client pod's address (its eth0's).
pub fn client_ip(pair: &Pair) -> Result<Ipv4Addr> {
    let out = ebpf_cni_tests::run_in(&pair.client_ns, "ip", &["-4", "-o", "addr", "show", "dev", "eth0"])?;
    let text = String::from_utf8(out.stdout)?;
    let address = text.split_whitespace().skip_while(|w| *w != "inet").nth(1).context("no IPv4 address on eth0")?;
    Ok(address.split('/').next().unwrap_or_default().parse()?)
}

/// Whether a TCP connection from `client_ns` to `to` (a listener in `server_ns`) is set up
/// within 300 ms.
fn connects(client_ns: &str, to: SocketAddrV4, server_ns: &str) -> Result<bool> {
    let _listener = ebpf_cni_tests::traffic::tcp_listener(server_ns, to)?;
    in_netns(client_ns, move || {
        Ok(std::net::TcpStream::connect_timeout(&to.into(), std::time::Duration::from_millis(300)).is_ok())
    })
}

/// `flow`'s ping-pong p50 and p99 (µs) and connections per second on each node, in `nodes`'
/// order. Each figure is measured in two halves, the nodes in turn and then in the reverse
/// turn (A B C, C B A), and its halves averaged: a drift of the machine's speed within the
/// round weighs on every node alike. Every node's ping-pongs, then every node's connection
/// rates: each measurement finds its node in the state the others found theirs in (the same
/// runs before it, the same `TIME_WAIT`s). Connections run on the ping-pong's CPU, client and
/// server: one placement for every node.
fn measure_by_turns(s: &Settings, nodes: &mut [(Path, Pair)], flow: Flow) -> Result<Vec<Vec<f64>>> {
    let half = s.latency_seconds.div_ceil(2);
    let turns = |n: usize| (0..n).chain((0..n).rev());
    let mut sums = vec![[0.0; 3]; nodes.len()];
    for i in turns(nodes.len()) {
        let latency = ping_pong(&mut nodes[i].1, flow, half)?;
        sums[i][0] += latency.p50_us / 2.0;
        sums[i][1] += latency.p99_us / 2.0;
    }
    for i in turns(nodes.len()) {
        sums[i][2] += connection_rate(&mut nodes[i].1, flow, half)? / 2.0;
    }
    Ok(sums.into_iter().map(|s| s.to_vec()).collect())
}

/// `flow`'s TCP ping-pong on `pair`'s node for `seconds`, client and server on one CPU.
fn ping_pong(pair: &mut Pair, flow: Flow, seconds: u32) -> Result<sockperf::Latency> {
    dialling(pair, flow, |dialled, _| sockperf::ping_pong(dialled, sockperf::Protocol::Tcp, seconds, LATENCY_CPU))
}

/// `flow`'s new connections per second on `pair`'s node over `seconds`, on the ping-pong's CPU.
fn connection_rate(pair: &mut Pair, flow: Flow, seconds: u32) -> Result<f64> {
    let listen = SocketAddrV4::new(pair.server_ip.parse()?, CONN_PORT);
    dialling(pair, flow, |dialled, dial| {
        let cgroup = dialled.client_cgroup();
        conn_rate::per_second_in_process(
            &dialled.client_ns,
            cgroup,
            &dialled.server_ns,
            listen,
            dial,
            seconds,
            Some(LATENCY_CPU),
        )
    })
}

/// The policy node's (`pair`'s) ping-pong p50 (µs) and connections/s with its `policies`
/// (`[0]`) and with them taken away (`[1]`: `policy-set` with no NetworkPolicy, no pod
/// isolated), on that one node by turns (on, off, off, on; each state's halves averaged).
/// Against the separate no-policy node the ratio carries the spread between two nodes'
/// placements too: two nodes of one datapath ran up to 0.3 µs apart a round on this VM, a
/// fifth of what the target allows. On one node it has none of that.
fn measure_toggled(s: &Settings, pair: &mut Pair, flow: Flow, policies: usize) -> Result<[[f64; 2]; 2]> {
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let cluster = Cluster { client: client_ip(pair)?, server, node: "node-1" };
    let half = s.latency_seconds.div_ceil(2);
    let mut sums = [[0.0; 2]; 2];
    for on in [true, false, false, true] {
        let tb = pair.node().context("a CNI path has a node")?;
        if on {
            policy_set::write_to_maps(tb, &cluster, policies)?;
        } else {
            policy_set::clear_maps(tb, &cluster)?;
        }
        let state = &mut sums[usize::from(!on)];
        state[0] += ping_pong(pair, flow, half)?.p50_us / 2.0;
        state[1] += connection_rate(pair, flow, half)? / 2.0;
    }
    Ok(sums)
}

/// Runs `measure` with who dials what for `flow` on `pair`'s node: the pair itself, its client
/// in the socket LB's cgroup dialling the ClusterIP; or the client outside it dialling the
/// server (plain pod → pod).
fn dialling<T>(pair: &mut Pair, flow: Flow, measure: impl FnOnce(&Pair, SocketAddrV4) -> Result<T>) -> Result<T> {
    let server: Ipv4Addr = pair.server_ip.parse()?;
    match flow {
        Flow::PodToPod => {
            let direct = Pair::borrowed(&pair.client_ns, &pair.server_ns, &pair.server_ip);
            measure(&direct, SocketAddrV4::new(server, CONN_PORT))
        }
        Flow::ClusterIp => {
            pair.dial_ip = CLUSTER_IP.to_string();
            measure(pair, SocketAddrV4::new(CLUSTER_IP, CONN_PORT))
        }
    }
}
