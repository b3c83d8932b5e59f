//! `ebpf-cni service-set` (hidden): one Service into a network's maps through the writer, as
//! the agent will write them, for tests and for trying the socket LB by hand. Prints what
//! settling the removed backends' sockets did, as JSON.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;

use super::{Exposure, Frontend, Protocol, ServiceWriter};
use crate::{bpf::read, cni::config::DEFAULT_BPFFS_ROOT};

#[derive(Args)]
pub struct ServiceSet {
    #[arg(long, short)]
    network: String,
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// The Service's address and port (`10.96.0.10:53`, `[fd00::a]:80`).
    #[arg(long)]
    frontend: SocketAddr,
    #[arg(long, default_value = "tcp")]
    protocol: Protocol,
    /// A backend (`10.1.0.5:8053`); repeat for more; none: the Service has no endpoint.
    #[arg(long = "backend")]
    backends: Vec<SocketAddr>,
    /// `sessionAffinity: ClientIP` with this timeout in seconds.
    #[arg(long)]
    affinity_seconds: Option<u64>,
    /// Reached per packet from the LAN too (a LoadBalancer IP, an externalIP); a frontend
    /// `0.0.0.0:<port>` (`[::]:<port>`) is a NodePort on the node's address, always external.
    #[arg(long)]
    external: bool,
    /// `externalTrafficPolicy: Local` (the backends given are this node's).
    #[arg(long)]
    local: bool,
    /// Remove the Service instead.
    #[arg(long, conflicts_with = "backends")]
    remove: bool,
}

pub fn run(args: ServiceSet) -> anyhow::Result<()> {
    let pins = read::pinned(&args.bpffs_root, &args.network)?;
    let mut writer = ServiceWriter::open(&pins)?;
    let frontend = Frontend { ip: args.frontend.ip(), port: args.frontend.port(), protocol: args.protocol };
    let settled = if args.remove {
        writer.remove(frontend)?.with_context(|| format!("no Service {} {:?}", args.frontend, args.protocol))?
    } else {
        let affinity = args.affinity_seconds.map(Duration::from_secs);
        let exposure = Exposure { external: args.external, local: args.local };
        if exposure == Exposure::default() {
            writer.upsert(frontend, &args.backends, affinity)?
        } else {
            writer.upsert_exposed(frontend, &args.backends, affinity, exposure)?
        }
    };
    crate::cli::write_stdout(&format!("{}\n", serde_json::to_string(&settled)?))?;
    Ok(())
}
