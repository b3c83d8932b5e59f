//! What the policy thread did, for the agent's metrics: written by that thread after each
//! sync, read at each scrape, with the per-policy flow counts read from `POLICY_COUNTS` then.
use std::sync::{
    Mutex,
    atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
};

use crate::{
    bpf::{Pins, policy_maps},
    metrics::{Exposition, SyncLatency},
};

#[derive(Default)]
pub struct PolicyStats {
    running: AtomicBool,
    latency: SyncLatency,
    bad_input: AtomicU64,
    enforcing: AtomicBool,
    sizes: Mutex<Sizes>,
    slots: Mutex<Slots>,
}

/// The pins the flow counts are read from, and slot → namespace and name.
type Slots = (Option<Pins>, Vec<(u32, String, String)>);

#[derive(Clone, Copy, Default)]
pub struct Sizes {
    pub policies: usize,
    pub identities: usize,
    pub rules: usize,
}

impl PolicyStats {
    /// The thread runs; its counts are read from `pins` (the network's, as last found).
    pub fn started(&self, pins: Option<Pins>) {
        self.running.store(true, Relaxed);
        if let Ok(mut slots) = self.slots.lock() {
            slots.0 = pins;
        }
    }

    /// One sync: from the batch's first event to its entries in the maps.
    pub fn synced(&self, took: std::time::Duration, enforcing: bool) {
        self.latency.observe(took);
        self.enforcing.store(enforcing, Relaxed);
    }

    pub fn bad_input(&self, lines: usize) {
        self.bad_input.fetch_add(lines as u64, Relaxed);
    }

    pub fn sizes(&self, sizes: Sizes, slots: Vec<(u32, String, String)>) {
        if let Ok(mut s) = self.sizes.lock() {
            *s = sizes;
        }
        if let Ok(mut s) = self.slots.lock() {
            s.1 = slots;
        }
    }

    pub fn write(&self, page: &mut Exposition) {
        if !self.running.load(Relaxed) {
            return;
        }
        self.latency.write(
            page,
            "ebpf_cni_policy_sync_duration_seconds",
            "A batch of NetworkPolicy, Pod and Namespace events (or a change of the node's pods), from the first \
             event taken to the policy maps written.",
        );
        let sizes = self.sizes.lock().map(|s| *s).unwrap_or_default();
        let help_sizes = "What the last compile produced: NetworkPolicies, identity entries, rule entries.";
        for (what, n) in [("policies", sizes.policies), ("identities", sizes.identities), ("rules", sizes.rules)] {
            page.gauge("ebpf_cni_policy_entries", help_sizes, &[("kind", what)], n as u64);
        }
        page.gauge(
            "ebpf_cni_policy_enforcing",
            "1 when the primary network's datapath enforces NetworkPolicy (FEATURE_POLICY) and the maps are written.",
            &[],
            u64::from(self.enforcing.load(Relaxed)),
        );
        page.counter(
            "ebpf_cni_policy_bad_input_total",
            "Invalid NetworkPolicy input met (an invalid selector, CIDR or port, an unknown namespace, a shared \
             address...), each with a log line; counted once per distinct line set of a compile.",
            &[],
            self.bad_input.load(Relaxed),
        );
        self.write_flows(page);
    }

    fn write_flows(&self, page: &mut Exposition) {
        let Ok(slots) = self.slots.lock() else { return };
        let Some(pins) = slots.0.as_ref().filter(|_| self.enforcing.load(Relaxed)) else { return };
        let Ok(counts) = policy_maps::policy_counts(pins, slots.1.iter().map(|(slot, _, _)| *slot)) else { return };
        let help = "New flows a NetworkPolicy allowed (the first policy by namespace/name that allows) and denied \
                    (the first that isolates the pod), from POLICY_COUNTS.";
        for (slot, namespace, name) in &slots.1 {
            let Some(count) = counts.get(slot) else { continue };
            for (verdict, n) in [("allowed", count.allowed_flows), ("denied", count.denied_flows)] {
                let labels = [("namespace", namespace.as_str()), ("policy", name.as_str()), ("verdict", verdict)];
                page.counter("ebpf_cni_policy_flows_total", help, &labels, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn series_after_start() {
        let mut page = Exposition::default();
        PolicyStats::default().write(&mut page);
        assert_eq!(page.render(), "");
        let stats = PolicyStats::default();
        stats.started(None);
        stats.synced(Duration::from_millis(3), false);
        stats.bad_input(2);
        stats.sizes(Sizes { policies: 4, identities: 9, rules: 30 }, Vec::new());
        let mut page = Exposition::default();
        stats.write(&mut page);
        let text = page.render();
        assert!(text.contains("ebpf_cni_policy_sync_duration_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("ebpf_cni_policy_entries{kind=\"rules\"} 30\n"), "{text}");
        assert!(text.contains("ebpf_cni_policy_bad_input_total 2\n"), "{text}");
    }
}
