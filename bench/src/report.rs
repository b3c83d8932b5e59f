//! The figures of a run and their table: per path the median over rounds, and per pair of paths
//! the median of the per-round ratios (each round measured every path back to back, so a ratio
//! within a round cancels drift that a ratio of medians would keep).
use std::fmt::Write as _;

use crate::{stats::Samples, topology::Path};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// A bound on ebpf-cni's value: relative to another path's (median of per-round ratios), or
/// on the value itself.
#[derive(Clone, Copy)]
pub struct Target {
    pub against: Option<Path>,
    pub bound: f64,
}

pub struct Figure {
    pub section: &'static str,
    pub name: String,
    pub unit: &'static str,
    pub better: Better,
    /// One value per round for each path measured, in round order; with `pooled_p99`, every
    /// sample of every round.
    pub values: Vec<(Path, Samples)>,
    pub target: Option<Target>,
    /// The figure is the 99th percentile of all samples (and its ratio the ratio of those).
    pub pooled_p99: bool,
}

impl Figure {
    pub fn new(section: &'static str, name: impl Into<String>, unit: &'static str, better: Better) -> Self {
        Self { section, name: name.into(), unit, better, values: Vec::new(), target: None, pooled_p99: false }
    }

    pub fn pooled_p99(mut self) -> Self {
        self.pooled_p99 = true;
        self
    }

    pub fn target(mut self, against: Option<Path>, bound: f64) -> Self {
        self.target = Some(Target { against, bound });
        self
    }

    pub fn record(&mut self, path: Path, value: f64) {
        match self.values.iter_mut().find(|(p, _)| *p == path) {
            Some((_, samples)) => samples.push(value),
            None => self.values.push((path, [value].into_iter().collect())),
        }
    }

    pub fn samples(&self, path: Path) -> Option<&Samples> {
        self.values.iter().find(|(p, _)| *p == path).map(|(_, s)| s)
    }

    /// The figure's value for a path: the median over rounds (or the pooled p99).
    pub fn median(&self, path: Path) -> Option<f64> {
        let samples = self.samples(path)?;
        Some(if self.pooled_p99 { samples.p99() } else { samples.median() })
    }

    /// Median over rounds of ebpf-cni's value divided by `other`'s in the same round (or the
    /// ratio of the pooled p99s).
    pub fn ratio(&self, other: Path) -> Option<f64> {
        if self.pooled_p99 {
            return Some(self.median(Path::EbpfCni)? / self.median(other)?).filter(|r| r.is_finite());
        }
        let (ours, theirs) = (self.samples(Path::EbpfCni)?, self.samples(other)?);
        let ratios: Samples = ours.values().iter().zip(theirs.values()).map(|(a, b)| a / b).collect();
        Some(ratios.median()).filter(|r| r.is_finite())
    }

    /// Whether ebpf-cni meets the target (None: no target, or nothing to judge it by).
    pub fn met(&self) -> Option<bool> {
        let target = self.target?;
        let value = match target.against {
            Some(other) => self.ratio(other)?,
            None => self.median(Path::EbpfCni)?,
        };
        Some(match self.better {
            Better::Higher => value >= target.bound,
            Better::Lower => value <= target.bound,
        })
    }

    fn target_text(&self) -> String {
        let Some(t) = self.target else { return String::new() };
        let op = if self.better == Better::Higher { "≥" } else { "≤" };
        match t.against {
            Some(other) => format!("{op} {:.2}× {}", t.bound, other.name()),
            None => format!("{op} {}", t.bound),
        }
    }

    /// ebpf-cni and every other path measured have values, all of them finite.
    pub fn complete(&self) -> bool {
        self.samples(Path::EbpfCni).is_some()
            && self.values.iter().all(|(_, s)| !s.values().is_empty() && s.values().iter().all(|v| v.is_finite()))
    }
}

/// The Markdown table: one row per figure.
pub fn table(figures: &[Figure]) -> String {
    let mut out = String::new();
    out.push_str("| section | figure | unit | ebpf-cni | bridge | bare veth | loopback | ÷ bridge | ÷ bare veth | target | met |\n");
    out.push_str("|---|---|---|--:|--:|--:|--:|--:|--:|---|---|\n");
    for f in figures {
        let cell = |p: Path| f.median(p).map_or("–".into(), number);
        let ratio = |p: Path| f.ratio(p).map_or("–".into(), |r| format!("{r:.2}×"));
        let met = match f.met() {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {met} |",
            f.section,
            f.name,
            f.unit,
            cell(Path::EbpfCni),
            cell(Path::Bridge),
            cell(Path::BareVeth),
            cell(Path::Loopback),
            ratio(Path::Bridge),
            ratio(Path::BareVeth),
            f.target_text(),
        );
    }
    out
}

/// Three significant digits, no exponent.
pub fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}
