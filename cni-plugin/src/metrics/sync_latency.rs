//! A sync-latency histogram the agent's threads fill and its metrics thread reads: lock-free
//! counts, turned into the cumulative buckets the exposition format wants at each scrape.
use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use super::Exposition;

/// Upper bounds of the buckets, seconds: around the issues' targets (Services 50 ms p99,
/// NetworkPolicy 100 ms p99 and 1 s at most), with room either side.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

#[derive(Default)]
pub struct SyncLatency {
    /// Observations at most each bound of [`BUCKETS`] (not cumulative here).
    buckets: [AtomicU64; BUCKETS.len()],
    syncs: AtomicU64,
    sum_us: AtomicU64,
}

impl SyncLatency {
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(bucket) = BUCKETS.iter().position(|&le| seconds <= le) {
            self.buckets[bucket].fetch_add(1, Relaxed);
        }
        self.syncs.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(took.as_micros() as u64, Relaxed);
    }

    pub fn write(&self, page: &mut Exposition, name: &'static str, help: &'static str) {
        let mut cumulative = 0;
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&le, n)| {
                cumulative += n.load(Relaxed);
                (le, cumulative)
            })
            .collect();
        let sum = self.sum_us.load(Relaxed) as f64 / 1e6;
        page.histogram(name, help, &[], &buckets, sum, self.syncs.load(Relaxed));
    }
}
