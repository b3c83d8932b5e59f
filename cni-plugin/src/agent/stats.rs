//! What the agent's syncs did, for its metrics: updated by the sync (route watch) thread, read by
//! the metrics thread at each scrape. Plain atomics: each figure is read on its own, and a scrape
//! that lands mid-sync shows the one before or the one after.
use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{SystemTime, UNIX_EPOCH},
};

use crate::metrics::Exposition;

#[derive(Default)]
pub struct Stats {
    routes: AtomicU64,
    syncs: AtomicU64,
    errors: AtomicU64,
    /// Wall-clock milliseconds of the last sync that ran to the end; 0 before the first.
    last_sync_ms: AtomicU64,
}

impl Stats {
    /// A sync that read the routes and tried every change: the agent now has `routes` routes;
    /// `complete` when none failed.
    pub fn synced(&self, routes: usize, complete: bool) {
        self.routes.store(routes as u64, Relaxed);
        self.syncs.fetch_add(1, Relaxed);
        if !complete {
            self.errors.fetch_add(1, Relaxed);
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.last_sync_ms.store(now.as_millis() as u64, Relaxed);
    }

    /// A sync that could not run (the routes could not be read): the figures before it stand.
    pub fn failed(&self) {
        self.syncs.fetch_add(1, Relaxed);
        self.errors.fetch_add(1, Relaxed);
    }

    pub fn write(&self, page: &mut Exposition) {
        page.gauge(
            "ebpf_cni_agent_routes",
            "Routes to other nodes' pod CIDRs that the agent has in the node's main table (proto 236), as of its last sync.",
            &[],
            self.routes.load(Relaxed),
        );
        page.counter(
            "ebpf_cni_agent_syncs_total",
            "Syncs of the node's routes with the cluster's nodes (on each change, and at least once per --interval).",
            &[],
            self.syncs.load(Relaxed),
        );
        page.counter(
            "ebpf_cni_agent_sync_errors_total",
            "Syncs that failed, or left a wanted route unset (see the agent's log).",
            &[],
            self.errors.load(Relaxed),
        );
        page.gauge(
            "ebpf_cni_agent_last_sync_timestamp_seconds",
            "When the last sync that ran to the end finished (some routes may have failed), Unix seconds; 0 before the first.",
            &[],
            self.last_sync_ms.load(Relaxed) as f64 / 1e3,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;
    use crate::metrics::Exposition;

    fn page(stats: &Stats) -> String {
        let mut page = Exposition::default();
        stats.write(&mut page);
        page.render()
    }

    #[test]
    fn counts_syncs_and_their_failures() {
        let stats = Stats::default();
        assert!(page(&stats).contains("\nebpf_cni_agent_last_sync_timestamp_seconds 0\n"));
        stats.synced(3, true);
        stats.synced(2, false);
        stats.failed();
        let text = page(&stats);
        for line in ["ebpf_cni_agent_routes 2", "ebpf_cni_agent_syncs_total 3", "ebpf_cni_agent_sync_errors_total 2"] {
            assert!(text.contains(&format!("\n{line}\n")), "{line}: {text}");
        }
        assert!(!text.contains("last_sync_timestamp_seconds 0\n"), "{text}");
    }
}
