//! Pod → pod on one node, every path measured in every round, the order rotating: throughput
//! (1 and 4 TCP streams), retransmits, 64-byte UDP packets per second, request/response
//! latency, and the CPU the machine spent per GB moved.
use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{
    Settings, iperf,
    iperf::Placement,
    report::{Better::*, Figure},
    sockperf::{self, Protocol},
    topology::{self, Path},
};

const SECTION: &str = "pod → pod";
/// Sender on CPU 0, receiver on CPU 1: the two sides never compete for a CPU.
const SPLIT: Placement = Placement { client_cpu: Some(0), server_cpu: Some(1) };
const FREE: Placement = Placement { client_cpu: None, server_cpu: None };
/// Client and server of the latency runs share this CPU (see sockperf.rs).
const LATENCY_CPU: usize = 1;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let ceiling = Some(Path::BareVeth);
    let mut tcp1 = Figure::new(SECTION, "TCP, 1 stream (CPUs 0→1)", "Gbit/s", Higher).target(ceiling, 0.95);
    let mut retr1 = Figure::new(SECTION, "TCP retransmits, 1 stream", "per run", Lower);
    let mut tcp4 = Figure::new(SECTION, "TCP, 4 streams (unpinned)", "Gbit/s", Higher).target(ceiling, 0.95);
    let mut retr4 = Figure::new(SECTION, "TCP retransmits, 4 streams", "per run", Lower);
    let mut udp = Figure::new(SECTION, "UDP 64 B received (CPUs 0→1)", "kpps", Higher).target(ceiling, 0.95);
    let mut loss = Figure::new(SECTION, "UDP 64 B loss", "%", Lower);
    let mut lat = [
        Figure::new(SECTION, "TCP ping-pong RTT p50 (same CPU)", "µs", Lower).target(ceiling, 1.05),
        Figure::new(SECTION, "TCP ping-pong RTT p99 (same CPU)", "µs", Lower).target(ceiling, 1.05),
        Figure::new(SECTION, "UDP ping-pong RTT p50 (same CPU)", "µs", Lower).target(ceiling, 1.05),
        Figure::new(SECTION, "UDP ping-pong RTT p99 (same CPU)", "µs", Lower).target(ceiling, 1.05),
    ];
    let mut cpu = Figure::new("cost", "CPU per GB, TCP 1 stream", "CPU s/GB", Lower).target(Some(Path::Bridge), 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::ALL, round) {
            let pair = topology::build(path, ours)?;
            let one = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
            let four = iperf::tcp(&pair, s.seconds, 4, FREE, false)?;
            let small = iperf::udp(&pair, s.seconds, 64, SPLIT)?;
            let tcp_rtt = sockperf::ping_pong(&pair, Protocol::Tcp, s.latency_seconds, LATENCY_CPU)?;
            let udp_rtt = sockperf::ping_pong(&pair, Protocol::Udp, s.latency_seconds, LATENCY_CPU)?;
            eprintln!(
                "pod→pod round {round} {:9}: TCP {:.2}/{:.2} Gbit/s ({}/{} retr), UDP {:.0} kpps ({:.1}% lost), \
                 RTT TCP {:.1}/{:.1} µs, UDP {:.1}/{:.1} µs, {:.2} CPU s/GB",
                path.name(),
                one.gbits,
                four.gbits,
                one.retransmits,
                four.retransmits,
                small.pps / 1e3,
                small.loss_percent,
                tcp_rtt.p50_us,
                tcp_rtt.p99_us,
                udp_rtt.p50_us,
                udp_rtt.p99_us,
                one.cpu_s_per_gb
            );
            tcp1.record(path, one.gbits);
            retr1.record(path, one.retransmits as f64);
            tcp4.record(path, four.gbits);
            retr4.record(path, four.retransmits as f64);
            udp.record(path, small.pps / 1e3);
            loss.record(path, small.loss_percent);
            for (figure, value) in lat.iter_mut().zip([tcp_rtt.p50_us, tcp_rtt.p99_us, udp_rtt.p50_us, udp_rtt.p99_us])
            {
                figure.record(path, value);
            }
            cpu.record(path, one.cpu_s_per_gb);
        }
    }
    let mut figures = vec![tcp1, retr1, tcp4, retr4, udp, loss];
    figures.extend(lat);
    figures.push(cpu);
    Ok(figures)
}
