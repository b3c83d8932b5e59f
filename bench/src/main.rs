//! Benchmarks of ebpf-cni against the reference `bridge` plugin, each on throwaway namespaces
//! built the same way for both, rounds interleaved so that drift hits both alike.
mod add_del;
mod iperf;
mod masquerade;
mod stats;

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use ebpf_cni_tests::{Plugin, Testbed, require_privileges};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "ebpf-cni vs bridge")]
struct Cli {
    /// The ebpf-cni binary (default: EBPF_CNI_BIN or the debug build).
    #[arg(long, global = true)]
    plugin: Option<PathBuf>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// ADD/DEL wall time as a runtime sees it.
    AddDel(add_del::AddDelArgs),
    /// iperf3 pod → external server through masquerade: BPF vs bridge's iptables.
    Masquerade(masquerade::MasqueradeArgs),
}

/// The two plugins compared.
#[derive(Clone, Copy)]
pub enum Contender {
    EbpfCni,
    Bridge,
}

impl Contender {
    pub const BOTH: [Self; 2] = [Self::EbpfCni, Self::Bridge];

    pub fn name(self) -> &'static str {
        match self {
            Self::EbpfCni => "ebpf-cni",
            Self::Bridge => "bridge",
        }
    }

    pub fn plugin(self, ours: &Plugin) -> Plugin {
        match self {
            Self::EbpfCni => ours.clone(),
            Self::Bridge => Plugin { binary: "/usr/lib/cni/bridge".into() },
        }
    }

    /// The network configuration: ours as the testbed writes it (with its `extra` fields), or
    /// bridge with the gateway (and pods' default route) on the bridge, ipMasq and the same pool.
    pub fn conf(self, tb: &Testbed) -> Value {
        match self {
            Self::EbpfCni => tb.conf("1.0.0"),
            Self::Bridge => json!({
                "cniVersion": "1.0.0",
                "name": tb.network,
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": true,
                "mtu": ebpf_cni_tests::TEST_MTU,
                "ipam": { "type": "host-local", "subnet": tb.subnet, "dataDir": tb.data_dir() },
            }),
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if !require_privileges("bench") {
        bail!("the benchmarks create network namespaces and load eBPF: run them as root");
    }
    let ours = match cli.plugin {
        Some(binary) => Plugin { binary },
        None => Plugin::from_env()?,
    };
    match &cli.bench {
        Bench::AddDel(args) => add_del::run(args, &ours),
        Bench::Masquerade(args) => masquerade::run(args, &ours),
    }
}
