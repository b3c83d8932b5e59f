//! Control-plane benchmark: wall time of ADD and DEL as a runtime sees it (process start to
//! exit), for ebpf-cni and the reference `bridge` plugin (isGateway, ipMasq, host-local) on
//! identical throwaway nodes, rounds interleaved A B A B so drift hits both alike.
use anyhow::{Result, ensure};
use clap::Args;
use ebpf_cni_tests::{Plugin, Testbed};
use serde_json::Value;

use crate::{Contender, stats::Samples};

#[derive(Args)]
pub struct AddDelArgs {
    /// Pods added (then deleted) per round and plugin.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// Rounds per plugin, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

pub fn run(args: &AddDelArgs, ours: &Plugin) -> Result<()> {
    let mut add = [Samples::default(), Samples::default()];
    let mut del = [Samples::default(), Samples::default()];
    for round in 0..args.rounds {
        for (slot, who) in Contender::BOTH.into_iter().enumerate() {
            let mut tb = Testbed::with_plugin(&format!("bench{round}{slot}"), "10.240.0.0/16", who.plugin(ours))?;
            let conf: Value = who.conf(&tb);
            for _ in 0..args.pods {
                let pod = tb.new_pod()?;
                let out = tb.cni("ADD", pod, &conf)?;
                ensure!(out.success, "{} ADD failed: {}", who.name(), out.stdout);
                add[slot].push(out.elapsed);
            }
            for pod in 0..args.pods {
                let out = tb.cni("DEL", pod, &conf)?;
                ensure!(out.success, "{} DEL failed: {}", who.name(), out.stdout);
                del[slot].push(out.elapsed);
            }
        }
    }
    println!("ADD/DEL wall time, {} pods x {} rounds per plugin, interleaved (ms)\n", args.pods, args.rounds);
    println!("| verb | plugin | p50 | p99 | ebpf-cni / bridge (p50) |");
    println!("|---|---|---|---|---|");
    for (verb, samples) in [("ADD", &add), ("DEL", &del)] {
        let ratio = samples[0].p50() / samples[1].p50();
        for (slot, who) in Contender::BOTH.into_iter().enumerate() {
            let r = if slot == 0 { format!("{ratio:.2}") } else { String::new() };
            println!("| {verb} | {} | {:.1} | {:.1} | {r} |", who.name(), samples[slot].p50(), samples[slot].p99());
        }
    }
    Ok(())
}
