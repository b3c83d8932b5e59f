//! `ebpf-cni inspect`: what a network's datapath holds, read from its pins in bpffs (the same
//! maps `bpftool map dump pinned …` prints) and, for `programs`, from the node's interfaces.
mod logs;
mod maps;
mod nat;
mod programs;
mod services;
mod table;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};

use crate::{bpf::read, cni::config::DEFAULT_BPFFS_ROOT, net::netns::Netns};
pub use table::Format;

#[derive(Args)]
pub struct Inspect {
    #[command(subcommand)]
    view: View,
    /// The network (the configuration's `name`). Default: the only network under the root.
    #[arg(long, short, global = true)]
    network: Option<String>,
    /// The configuration's `bpffsRoot`.
    #[arg(long, global = true, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// Network namespace of the node (a file such as /run/netns/x), for `programs` and for
    /// interface names. Default: the one this runs in.
    #[arg(long, global = true)]
    netns: Option<PathBuf>,
    #[arg(long, short, global = true, value_enum, default_value_t)]
    output: Format,
}

#[derive(Subcommand)]
enum View {
    /// Pods on this node (ENDPOINTS): address, host veth, MACs, owner.
    Endpoints,
    /// Masqueraded flows (NAT), both directions, with their idle time and their pod.
    Nat,
    /// Drops by reason (METRICS), summed over CPUs; every reason listed.
    Counters,
    /// The settings the programs were loaded with (SETTINGS).
    Settings,
    /// Services the socket LB translates (SVC_FRONTENDS): frontend → backends, affinity.
    Services,
    /// The BPF programs on the node's interfaces (tc filters and TCX), ours marked.
    Programs,
    /// Log lines of the TC programs (network configured with `ebpfLogLevel`). Reading consumes
    /// them: one reader at a time.
    Logs {
        /// Keep reading until interrupted.
        #[arg(long, short)]
        follow: bool,
    },
}

pub fn run(args: Inspect) -> Result<()> {
    let network = match args.network {
        Some(name) => name,
        None => only_network(&args.bpffs_root)?,
    };
    let pins = read::pinned(&args.bpffs_root, &network)?;
    let netns = args.netns.as_deref();
    match args.view {
        View::Endpoints => table::print(&maps::endpoints(&pins, &interfaces(netns)?)?, args.output),
        View::Nat => table::print(&nat::rows(&pins, || interfaces(netns))?, args.output),
        View::Counters => table::print(&maps::counters(&pins)?, args.output),
        View::Settings => table::print(&maps::settings(&pins, &interfaces(netns)?)?, args.output),
        View::Services => table::print(&services::rows(&pins)?, args.output),
        View::Programs => table::print(&programs::rows(&pins, &interfaces(netns)?)?, args.output),
        View::Logs { follow } => logs::read(&pins, follow),
    }
}

/// The node's interfaces and their programs, read in its namespace. Maps are opened by path
/// either way: bpffs belongs to the mount namespace, not the network one.
fn interfaces(netns: Option<&Path>) -> Result<programs::Interfaces> {
    let Some(path) = netns else { return programs::Interfaces::read() };
    let ns = Netns::open(path).with_context(|| format!("opening {}", path.display()))?;
    ns.run(programs::Interfaces::read).context("entering the node's namespace")?
}

/// The network to show when none is named: the only directory under the root.
fn only_network(root: &Path) -> Result<String> {
    match read::networks(root)?.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no network under {}: no pod has been added yet", root.display()),
        many => bail!("several networks under {}; choose one with --network: {}", root.display(), many.join(", ")),
    }
}
