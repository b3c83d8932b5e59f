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
    iperf::{FREE, SPLIT},
    qperf,
    report::{Better::*, Figure},
    sockperf::{self, LATENCY_CPU, Protocol},
    throughput::Throughput,
    topology::{self, Family, Pair, Path},
};

pub fn run(s: &Settings, ours: &Plugin, family: Family) -> Result<Vec<Figure>> {
    let section = match family {
        Family::V4 => "pod → pod",
        Family::V6 => "pod → pod, IPv6",
    };
    let ceiling = Some(Path::BareVeth);
    let mut throughput =
        Throughput::new(|name, unit, better| Figure::new(section, name, unit, better), |f| f.target(ceiling, 0.95));
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
            throughput.record(path, &one, four.as_ref(), &small);
            for (figure, value) in lat.iter_mut().zip(rtts) {
                figure.record(path, value);
            }
            cpu.record(path, one.cpu_s_per_gb);
        }
    }
    let mut figures = throughput.figures(family == Family::V4);
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
