//! `ebpf-cni agent`: keeps the node's routes to the other nodes' pod CIDRs (host-gw: each
//! via that node's InternalIP, which must be on a shared L2 segment) in step with the cluster's
//! Node objects, polling the API server. Routes stay when the agent stops, so pods keep
//! working through an agent restart or upgrade.
use std::{collections::BTreeMap, net::Ipv4Addr, thread::sleep, time::Duration};

use anyhow::{Context as _, Result};
use clap::Args;
use ipnetwork::Ipv4Network;

use crate::{kube, net::netlink::Netlink};

#[derive(Args)]
pub struct Agent {
    /// This node's name (the DaemonSet passes spec.nodeName): its own pod CIDR gets no route.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    #[command(flatten)]
    source: kube::Source,
    /// Seconds between two syncs.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    interval: u64,
    /// Sync once and exit (non-zero if the sync failed).
    #[arg(long)]
    once: bool,
}

/// What one sync changed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Changes {
    added: usize,
    removed: usize,
    failed: usize,
}

pub fn run(args: Agent) -> Result<()> {
    crate::logging::configure(log::LevelFilter::Info, None);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    loop {
        let outcome = runtime.block_on(sync(&args));
        match &outcome {
            Ok(c) if *c == Changes::default() => log::debug!("routes in sync"),
            Ok(c) => log::info!("routes: {} added or changed, {} removed, {} failed", c.added, c.removed, c.failed),
            Err(e) => log::error!("sync failed: {e:#}"),
        }
        if args.once {
            let changes = outcome?;
            anyhow::ensure!(changes.failed == 0, "{} routes could not be set", changes.failed);
            return Ok(());
        }
        sleep(Duration::from_secs(args.interval));
    }
}

async fn sync(args: &Agent) -> Result<Changes> {
    let wanted = wanted_routes(&args.source.nodes()?, &args.node);
    let netlink = Netlink::connect()?;
    let present: BTreeMap<Ipv4Network, Ipv4Addr> = netlink.agent_routes().await?.into_iter().collect();
    let mut changes = Changes::default();
    for (dst, gw) in &present {
        // A changed gateway is replaced below; only routes to vanished nodes go.
        if !wanted.contains_key(dst) {
            match netlink.delete_agent_route(*dst, *gw).await {
                Ok(()) => changes.removed += 1,
                Err(e) => fail(&mut changes, e),
            }
        }
    }
    for (dst, gw) in &wanted {
        if present.get(dst) != Some(gw) {
            match netlink
                .set_agent_route(*dst, *gw)
                .await
                .context("the gateway must be on a directly connected network")
            {
                Ok(()) => changes.added += 1,
                Err(e) => fail(&mut changes, e),
            }
        }
    }
    Ok(changes)
}

fn fail(changes: &mut Changes, e: anyhow::Error) {
    log::warn!("{e:#}");
    changes.failed += 1;
}

/// Every other node's IPv4 pod CIDR via its InternalIP. Nodes without either yet (a new node
/// before the controller manager gave it a CIDR) are skipped until they have both.
fn wanted_routes(nodes: &[kube::Node], own: &str) -> BTreeMap<Ipv4Network, Ipv4Addr> {
    nodes
        .iter()
        .filter(|n| n.metadata.name != own)
        .filter_map(|n| Some((n.pod_cidr_v4()?, n.internal_ipv4()?)))
        .collect()
}
