//! One sync: the routes present are read, compared with the nodes' (see `plan`) and changed.
use std::{collections::BTreeSet, sync::Arc};

use anyhow::{Result, anyhow};
use ipnetwork::IpNetwork;

use super::{
    plan::{Plan, Prune, doubt, plan, wanted_routes},
    stats::Stats,
};
use crate::{kube::Node, net::netlink::Netlink};

/// What one sync changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: usize,
    pub changed: usize,
    pub removed: usize,
    /// Why each route that should be there is not.
    pub failures: Vec<String>,
}

pub struct Syncer {
    runtime: tokio::runtime::Runtime,
    /// This node's name.
    pub own: String,
    /// Every sync's outcome, for the metrics.
    stats: Arc<Stats>,
}

impl Syncer {
    pub fn new(own: &str, stats: Arc<Stats>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        Ok(Self { runtime, own: own.to_string(), stats })
    }

    /// Brings the routes in line with `nodes`. A node absent from them is gone, and its route
    /// with it, unless `stale` (or the list itself, see `doubt`) says why it may not be; then only
    /// the routes to `deleted` destinations go. `deleted` is emptied once nothing failed.
    pub fn sync(&self, nodes: &[&Node], deleted: &mut BTreeSet<IpNetwork>, stale: Option<&str>) -> Result<Changes> {
        let suspect = doubt(nodes, &self.own);
        if let Some(why) = &suspect {
            log::warn!("{why}: no route is removed for a node missing from it");
        }
        let why = stale.or(suspect.as_deref());
        let prune = if why.is_some() { Prune::Only(deleted) } else { Prune::All };
        let wanted = wanted_routes(nodes, &self.own);
        let outcome = self.runtime.block_on(async {
            let netlink = Netlink::connect()?;
            let present = netlink.main_routes().await?;
            let plan = plan(&wanted, &present, prune);
            if !plan.kept.is_empty() {
                let kept: Vec<String> = plan.kept.iter().map(ToString::to_string).collect();
                log::info!("{}: kept the routes to {}", why.unwrap_or_default(), kept.join(", "));
            }
            let changes = apply(&netlink, plan).await;
            // Changes replace a route's gateway in place; only adds and removals change the count.
            let ours = present.ours.len() + changes.added - changes.removed;
            anyhow::Ok((changes, ours))
        });
        let (changes, ours) = outcome.inspect_err(|_| self.stats.failed())?;
        self.stats.synced(ours, changes.failures.is_empty());
        if changes.failures.is_empty() {
            deleted.clear();
        }
        Ok(changes)
    }

    /// [`Self::sync`], with its outcome in the log.
    pub fn sync_logged(&self, nodes: &[&Node], deleted: &mut BTreeSet<IpNetwork>, stale: Option<&str>) {
        match self.sync(nodes, deleted, stale) {
            Ok(changes) => log_changes(&changes),
            Err(e) => log::error!("sync failed: {e:#}"),
        }
    }
}

pub fn log_changes(c: &Changes) {
    if *c == Changes::default() {
        log::debug!("routes in sync");
    } else {
        let (added, changed, removed, failed) = (c.added, c.changed, c.removed, c.failures.len());
        log::info!("routes: {added} added, {changed} changed, {removed} removed, {failed} failed");
    }
}

async fn apply(netlink: &Netlink, plan: Plan) -> Changes {
    let mut changes = Changes::default();
    let mut failed = |e: anyhow::Error| {
        log::warn!("{e:#}");
        changes.failures.push(format!("{e:#}"));
    };
    for (dst, gw, theirs) in plan.blocked {
        failed(anyhow!("route {dst} via {gw} not set: {theirs} is there and is not the agent's, so it stays"));
    }
    let (mut added, mut changed, mut removed) = (0, 0, 0);
    for (dst, gw) in plan.remove {
        match netlink.delete_agent_route(dst, gw).await {
            Ok(()) => removed += 1,
            Err(e) => failed(e),
        }
    }
    for (dst, gw) in plan.change {
        match netlink.change_agent_route(dst, gw).await {
            Ok(()) => changed += 1,
            Err(e) => failed(e),
        }
    }
    for (dst, gw) in plan.add {
        match netlink.add_agent_route(dst, gw).await {
            Ok(()) => added += 1,
            Err(e) => failed(e),
        }
    }
    Changes { added, changed, removed, ..changes }
}
