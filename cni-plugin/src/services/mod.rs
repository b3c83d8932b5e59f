//! What the datapath must serve for the cluster's Services, kept from the API server's Services
//! and EndpointSlices by kube-proxy's rules; pure Rust, no BPF. The agent feeds the [`Model`]
//! (with `kubeProxyReplacement` on) and hands what changed to a [`ServiceSink`]: the BPF
//! writer's (the agent's `service_maps.rs`), or [`LogSink`].
//!
//! - `spec.rs`: the objects read into what a translation needs, bad input counted and logged;
//! - `translate.rs`: one Service's frontends and their backends;
//! - `model.rs`: every Service, and the differences handed to the sink;
//! - `frontend.rs`: the frontend, its entry and the sink trait.
mod frontend;
mod model;
mod spec;
mod stats;
#[cfg(test)]
mod tests;
mod translate;

pub use frontend::{Entry, Frontend, Kind, Protocol, ServiceSink, WhenEmpty};
pub use model::{DEFAULT_MAX_BACKENDS, Model};
pub use stats::Stats;
pub use translate::Node;

/// Says in the log what the datapath would be told, a line per batch (each frontend at debug),
/// until the BPF writer takes its place.
#[derive(Default)]
pub struct LogSink {
    upserts: usize,
    removals: usize,
}

impl ServiceSink for LogSink {
    fn upsert(&mut self, frontend: &Frontend, entry: &Entry) {
        self.upserts += 1;
        log::debug!("service frontend {frontend} ({}): {} backends", entry.service, entry.backends.len());
    }

    fn remove(&mut self, frontend: &Frontend) {
        self.removals += 1;
        log::debug!("service frontend {frontend}: removed");
    }

    fn flush(&mut self) {
        // The microseconds since the epoch: tests and the bench measure an API event's way to
        // the datapath from them (the log's own stamp has milliseconds only).
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        log::info!(
            "services: {} frontends set, {} removed (sink at {} us)",
            std::mem::take(&mut self.upserts),
            std::mem::take(&mut self.removals),
            at.as_micros()
        );
    }
}
