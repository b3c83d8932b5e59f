//! Order statistics over samples (wall times in ms, throughputs, counts).
use std::time::Duration;

#[derive(Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    /// A duration, in milliseconds.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e3);
    }

    pub fn push_value(&mut self, v: f64) {
        self.0.push(v);
    }

    /// The value below which `q` of the samples fall (nearest rank).
    pub fn quantile(&self, q: f64) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
    }

    pub fn p50(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }
}
