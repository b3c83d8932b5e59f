//! Throughput between a pod and an external server through masquerade: ebpf-cni (BPF NAT on
//! the uplink) vs bridge with ipMasq (iptables MASQUERADE), on the same topology (the tests'
//! `Cluster`: a node with an uplink to an external namespace), fresh for every round, the order
//! alternating. The pod opens the connection; data flows pod → server (upload) and, on a second
//! connection, server → pod (download, `iperf3 -R`), where replies take the reverse NAT path.
use anyhow::Result;
use clap::Args;
use ebpf_cni_tests::{Cluster, EXT_SERVER, Plugin};

use crate::{
    Contender,
    iperf::{self, Direction, Placement},
    stats::Samples,
};

#[derive(Args)]
pub struct MasqueradeArgs {
    /// iperf3 runs per plugin.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds per iperf3 run.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// CPU of the iperf3 client (in the pod) and of the server (outside).
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    #[arg(long, default_value_t = 1)]
    server_cpu: usize,
}

pub fn run(args: &MasqueradeArgs, ours: &Plugin) -> Result<()> {
    let at = Placement { client_cpu: args.client_cpu, server_cpu: args.server_cpu };
    // [direction][plugin]
    let mut gbits: [[Samples; 2]; 2] = Default::default();
    let mut retransmits: [[Samples; 2]; 2] = Default::default();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for slot in order {
            let who = Contender::BOTH[slot];
            let mut cluster =
                Cluster::new(&format!("bm{round}{slot}"), "10.241.0.0/16", ["10.241.1.0/24", "10.241.2.0/24"])?;
            let node = &mut cluster.nodes[0];
            node.plugin = who.plugin(ours);
            let pod = node.new_pod()?;
            let out = node.cni("ADD", pod, &who.conf(node))?;
            anyhow::ensure!(out.success, "{} ADD failed: {}", who.name(), out.stdout);
            for (d, direction) in Direction::BOTH.into_iter().enumerate() {
                let pod_ns = &node.pods[pod].netns.name;
                let report = iperf::run(&cluster.ext.name, EXT_SERVER, pod_ns, args.seconds, &at, direction)?;
                eprintln!(
                    "round {round} {:8} {:8}: {:.2} Gbit/s, {} retransmits",
                    who.name(),
                    NAMES[d],
                    report.gbits,
                    report.retransmits
                );
                gbits[d][slot].push_value(report.gbits);
                retransmits[d][slot].push_value(report.retransmits as f64);
            }
            node.cni("DEL", pod, &who.conf(node))?;
        }
    }
    println!(
        "iperf3 TCP through masquerade, {} runs x {} s per plugin and direction, plugins alternating; \
         iperf3 client (in the pod) on CPU {}, server (external) on CPU {}\n",
        args.rounds, args.seconds, args.client_cpu, args.server_cpu
    );
    println!("| direction | plugin | median Gbit/s | min | max | median retransmits | ebpf-cni / bridge (median) |");
    println!("|---|---|---|---|---|---|---|");
    for d in 0..2 {
        let ratio = gbits[d][0].p50() / gbits[d][1].p50();
        for (slot, who) in Contender::BOTH.into_iter().enumerate() {
            let r = if slot == 0 { format!("{ratio:.2}") } else { String::new() };
            let g = &gbits[d][slot];
            println!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.0} | {r} |",
                NAMES[d],
                who.name(),
                g.p50(),
                g.quantile(0.0),
                g.quantile(1.0),
                retransmits[d][slot].p50()
            );
        }
    }
    Ok(())
}

const NAMES: [&str; 2] = ["pod -> external", "external -> pod"];
