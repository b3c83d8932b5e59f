//! Pod → pod on one node, every path measured in every round, the order rotating: throughput
//! (1 and 4 TCP streams), retransmits, 64-byte UDP packets per second, request/response
//! latency, and the CPU the machine spent per GB moved. Over IPv6 (dual-stack pods, the same
//! configuration for both plugins) a section of its own: 1 TCP stream, UDP 64 B and mean
//! ping-pong round trips (qperf: sockperf 3.7 has no IPv6). Beside ebpf-cni, bridge, the bare
//! veth pair and loopback, the floor (`floor.rs`): ebpf-cni's pods with a program that only
//! rewrites the MACs and redirects, the least any program on the host veth can cost.
use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{
    Settings, iperf,
    iperf::Placement,
    qperf,
    report::{Better::*, Figure},
    sockperf::{self, Protocol},
    topology::{self, Family, Pair, Path},
};

/// Sender on CPU 0, receiver on CPU 1: the two sides never compete for a CPU.
const SPLIT: Placement = Placement { client_cpu: Some(0), server_cpu: Some(1) };
const FREE: Placement = Placement { client_cpu: None, server_cpu: None };
/// Client and server of the latency runs share this CPU (see sockperf.rs).
const LATENCY_CPU: usize = 1;

pub fn run(s: &Settings, ours: &Plugin, family: Family) -> Result<Vec<Figure>> {
    let section = match family {
        Family::V4 => "pod → pod",
        Family::V6 => "pod → pod, IPv6",
    };
    let ceiling = Some(Path::BareVeth);
    let mut tcp1 = Figure::new(section, "TCP, 1 stream (CPUs 0→1)", "Gbit/s", Higher).target(ceiling, 0.95);
    let mut retr1 = Figure::new(section, "TCP retransmits, 1 stream", "per run", Lower);
    let mut tcp4 = Figure::new(section, "TCP, 4 streams (unpinned)", "Gbit/s", Higher).target(ceiling, 0.95);
    let mut retr4 = Figure::new(section, "TCP retransmits, 4 streams", "per run", Lower);
    let mut udp = Figure::new(section, "UDP 64 B received (CPUs 0→1)", "kpps", Higher).target(ceiling, 0.95);
    let mut loss = Figure::new(section, "UDP 64 B loss", "%", Lower);
    let latency_names: &[&str] = match family {
        Family::V4 => &[
            "TCP ping-pong RTT p50 (same CPU)",
            "TCP ping-pong RTT p99 (same CPU)",
            "UDP ping-pong RTT p50 (same CPU)",
            "UDP ping-pong RTT p99 (same CPU)",
        ],
        Family::V6 => &["TCP ping-pong mean RTT (same CPU, qperf)", "UDP ping-pong mean RTT (same CPU, qperf)"],
    };
    // The p50s against the floor (`floor.rs`): what `from_pod` adds to the host veth's hop.
    let mut lat: Vec<Figure> = latency_names
        .iter()
        .map(|name| {
            let figure = Figure::new(section, *name, "µs", Lower);
            if name.contains("p50") { figure.target(Some(Path::Floor), 1.01) } else { figure.target(ceiling, 1.05) }
        })
        .collect();
    let mut cpu = Figure::new("cost", "CPU per GB, TCP 1 stream", "CPU s/GB", Lower).target(Some(Path::Bridge), 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::DATAPATH, round) {
            let pair = topology::build(path, ours, family)?;
            let one = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
            let four = match family {
                Family::V4 => Some(iperf::tcp(&pair, s.seconds, 4, FREE, false)?),
                Family::V6 => None,
            };
            let small = iperf::udp(&pair, s.seconds, 64, SPLIT)?;
            let rtts = latencies(&pair, family, s.latency_seconds)?;
            let rtt_text: Vec<String> = rtts.iter().map(|v| format!("{v:.1}")).collect();
            eprintln!(
                "{section} round {round} {:9}: TCP {:.2} Gbit/s ({} retr){}, UDP {:.0} kpps ({:.1}% lost), \
                 RTT {} µs, {:.2} CPU s/GB",
                path.name(),
                one.gbits,
                one.retransmits,
                four.as_ref().map_or(String::new(), |f| format!(", 4 streams {:.2} ({} retr)", f.gbits, f.retransmits)),
                small.pps / 1e3,
                small.loss_percent,
                rtt_text.join("/"),
                one.cpu_s_per_gb
            );
            tcp1.record(path, one.gbits);
            retr1.record(path, one.retransmits as f64);
            if let Some(four) = &four {
                tcp4.record(path, four.gbits);
                retr4.record(path, four.retransmits as f64);
            }
            udp.record(path, small.pps / 1e3);
            loss.record(path, small.loss_percent);
            for (figure, value) in lat.iter_mut().zip(rtts) {
                figure.record(path, value);
            }
            cpu.record(path, one.cpu_s_per_gb);
        }
    }
    let mut figures = vec![tcp1, retr1];
    if family == Family::V4 {
        figures.extend([tcp4, retr4]);
    }
    figures.extend([udp, loss]);
    figures.extend(lat);
    if family == Family::V4 {
        figures.push(cpu);
    }
    Ok(figures)
}

/// The round trips of [`run`]'s latency figures, in their order, µs.
fn latencies(pair: &Pair, family: Family, seconds: u32) -> Result<Vec<f64>> {
    Ok(match family {
        Family::V4 => {
            let tcp = sockperf::ping_pong(pair, Protocol::Tcp, seconds, LATENCY_CPU)?;
            let udp = sockperf::ping_pong(pair, Protocol::Udp, seconds, LATENCY_CPU)?;
            vec![tcp.p50_us, tcp.p99_us, udp.p50_us, udp.p99_us]
        }
        Family::V6 => vec![
            qperf::mean_rtt(pair, Protocol::Tcp, seconds, LATENCY_CPU)?,
            qperf::mean_rtt(pair, Protocol::Udp, seconds, LATENCY_CPU)?,
        ],
    })
}
