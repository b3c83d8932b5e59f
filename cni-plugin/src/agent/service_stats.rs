//! What the Service model's thread did, for the agent's metrics (with kubeProxyReplacement):
//! written by that thread after each batch, read by the metrics thread at each scrape.
//!
//! Sync latency is timed inside the agent: from the moment the model's thread took the first
//! update of a batch off its queue to the moment the sink had written the batch's changes into
//! the maps. The bench's `service_sync.rs` times the whole way, API server write to map entry.
use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use crate::{
    metrics::{Exposition, SyncLatency},
    services::Stats as ModelStats,
};

#[derive(Default)]
pub struct ServiceStats {
    /// Set once the model's thread runs: the series are on the page only then.
    running: AtomicBool,
    /// 0 until the first sync after both first lists; then how long it took from the first list.
    first_sync_us: AtomicU64,
    latency: SyncLatency,
    frontends_changed: AtomicU64,
    /// The model's own counts of input it could not serve as given, as of the last batch.
    model: Mutex<ModelStats>,
}

impl ServiceStats {
    pub fn started(&self) {
        self.running.store(true, Relaxed);
    }

    pub fn first_sync(&self, since_first_list: Duration) {
        self.first_sync_us.store((since_first_list.as_micros() as u64).max(1), Relaxed);
    }

    /// A batch after the first sync: how long it took and how many frontends it changed.
    pub fn synced(&self, took: Duration, changed: usize) {
        self.latency.observe(took);
        self.frontends_changed.fetch_add(changed as u64, Relaxed);
    }

    pub fn model(&self, stats: &ModelStats) {
        if let Ok(mut model) = self.model.lock() {
            model.clone_from(stats);
        }
    }

    pub fn write(&self, page: &mut Exposition) {
        if !self.running.load(Relaxed) {
            return;
        }
        self.latency.write(
            page,
            "ebpf_cni_service_sync_duration_seconds",
            "A batch of Service and EndpointSlice events, from the model taking its first event to its changes \
             written into the maps (after the first sync).",
        );
        page.gauge(
            "ebpf_cni_service_first_sync_seconds",
            "From the first list of Services or EndpointSlices to all frontends in the maps; 0 until then.",
            &[],
            self.first_sync_us.load(Relaxed) as f64 / 1e6,
        );
        page.counter(
            "ebpf_cni_service_frontend_changes_total",
            "Frontends written or removed by the syncs after the first one.",
            &[],
            self.frontends_changed.load(Relaxed),
        );
        let Ok(model) = self.model.lock().map(|m| m.clone()) else { return };
        for (what, count) in model.named() {
            page.counter(
                "ebpf_cni_service_input_total",
                "What the agent met in the API's Services and EndpointSlices and did not serve as given, by kind \
                 (skipped: headless, ExternalName or another proxy's, not an error); each also has a log line.",
                &[("kind", what)],
                count,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ServiceStats;
    use crate::metrics::Exposition;

    #[test]
    fn nothing_is_shown_before_the_model_runs() {
        let mut page = Exposition::default();
        ServiceStats::default().write(&mut page);
        assert_eq!(page.render(), "");
    }

    #[test]
    fn latencies_land_in_cumulative_buckets() {
        let stats = ServiceStats::default();
        stats.started();
        stats.synced(Duration::from_micros(800), 1);
        stats.synced(Duration::from_millis(30), 2);
        stats.synced(Duration::from_secs(10), 1);
        let mut page = Exposition::default();
        stats.write(&mut page);
        let text = page.render();
        assert!(text.contains("ebpf_cni_service_sync_duration_seconds_bucket{le=\"0.001\"} 1\n"), "{text}");
        assert!(text.contains("ebpf_cni_service_sync_duration_seconds_bucket{le=\"0.05\"} 2\n"), "{text}");
        assert!(text.contains("ebpf_cni_service_sync_duration_seconds_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("ebpf_cni_service_sync_duration_seconds_count 3\n"), "{text}");
        assert!(text.contains("ebpf_cni_service_frontend_changes_total 4\n"), "{text}");
        assert!(text.contains("ebpf_cni_service_input_total{kind=\"orphan-slices\"} 0\n"), "{text}");
    }
}
