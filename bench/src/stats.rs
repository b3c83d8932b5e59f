//! Order statistics over samples (wall times in ms, throughputs, counts).
#[derive(Clone, Default, Debug)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    pub fn extend(&mut self, other: &Samples) {
        self.0.extend_from_slice(&other.0);
    }

    pub fn values(&self) -> &[f64] {
        &self.0
    }

    /// The value below which `q` of the samples fall (nearest rank); NaN when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn p99(&self) -> f64 {
        self.quantile(0.99)
    }

    /// The smallest and the largest sample; None when empty.
    pub fn range(&self) -> Option<(f64, f64)> {
        let min = self.0.iter().copied().reduce(f64::min)?;
        let max = self.0.iter().copied().reduce(f64::max)?;
        Some((min, max))
    }
}

impl FromIterator<f64> for Samples {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}
