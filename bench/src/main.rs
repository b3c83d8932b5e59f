//! Control-plane benchmark: wall time of ADD and DEL as a runtime sees it (process start to
//! exit), for ebpf-cni and the reference `bridge` plugin (isGateway, ipMasq, host-local) on
//! identical throwaway nodes, rounds interleaved A B A B so drift hits both alike.
mod stats;

use std::path::PathBuf;

use anyhow::{Result, bail, ensure};
use clap::Parser;
use ebpf_cni_tests::{Plugin, Testbed, require_privileges};
use serde_json::{Value, json};

use crate::stats::Samples;

const BRIDGE: &str = "/usr/lib/cni/bridge";

#[derive(Parser)]
#[command(about = "ADD/DEL wall time: ebpf-cni vs bridge")]
struct Args {
    /// Pods added (then deleted) per round and plugin.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// Rounds per plugin, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The ebpf-cni binary (default: EBPF_CNI_BIN or the debug build).
    #[arg(long)]
    plugin: Option<PathBuf>,
}

#[derive(Clone, Copy)]
enum Contender {
    EbpfCni,
    Bridge,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Self::EbpfCni => "ebpf-cni",
            Self::Bridge => "bridge",
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !require_privileges("bench") {
        bail!("the benchmark creates network namespaces and loads eBPF: run it as root");
    }
    let ours = match args.plugin {
        Some(binary) => Plugin { binary },
        None => Plugin::from_env()?,
    };
    let mut add = [Samples::default(), Samples::default()];
    let mut del = [Samples::default(), Samples::default()];
    for round in 0..args.rounds {
        for (slot, who) in [Contender::EbpfCni, Contender::Bridge].into_iter().enumerate() {
            let plugin = match who {
                Contender::EbpfCni => ours.clone(),
                Contender::Bridge => Plugin { binary: BRIDGE.into() },
            };
            let mut tb = Testbed::with_plugin(&format!("bench{round}{slot}"), "10.240.0.0/16", plugin)?;
            let conf = conf(&tb, who);
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
        for (slot, who) in [Contender::EbpfCni, Contender::Bridge].into_iter().enumerate() {
            let r = if slot == 0 { format!("{ratio:.2}") } else { String::new() };
            println!("| {verb} | {} | {:.1} | {:.1} | {r} |", who.name(), samples[slot].p50(), samples[slot].p99());
        }
    }
    Ok(())
}

fn conf(tb: &Testbed, who: Contender) -> Value {
    match who {
        Contender::EbpfCni => tb.conf("1.0.0"),
        Contender::Bridge => json!({
            "cniVersion": "1.0.0",
            "name": tb.network,
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": true,
            "ipam": { "type": "host-local", "subnet": tb.subnet, "dataDir": tb.data_dir() },
        }),
    }
}
