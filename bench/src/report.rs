//! The figures of a run and their table: per path the median over rounds with the spread of the
//! rounds (min–max) beside it, and per pair of paths the ratio of the medians with the spread of
//! the per-round ratios beside it (each round measured every path back to back, so how far a
//! round's ratio strays shows how much the drift of this machine moved it).
use std::fmt::Write as _;

use crate::{stats::Samples, topology::Path};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// A bound on ebpf-cni's value: relative to another path's (ratio of the medians), or on the
/// value itself.
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
    /// One value per round for each path measured, in round order (for a pooled figure, the
    /// round's own 99th percentile).
    pub values: Vec<(Path, Samples)>,
    /// Every bound ebpf-cni must meet (the cross-node section sets two per figure).
    pub targets: Vec<Target>,
    /// With [`Figure::pooled_p99`]: every sample of every round, per path; the figure is their
    /// 99th percentile (one round holds too few samples for a p99 of its own to mean much).
    pub pooled: Option<Vec<(Path, Samples)>>,
    /// With [`Figure::own_columns`]: its section's table has the columns of the paths the
    /// section measured only, not the pod → pod ones.
    pub own_columns: bool,
}

impl Figure {
    pub fn new(section: &'static str, name: impl Into<String>, unit: &'static str, better: Better) -> Self {
        Self {
            section,
            name: name.into(),
            unit,
            better,
            values: Vec::new(),
            targets: Vec::new(),
            pooled: None,
            own_columns: false,
        }
    }

    /// The section's table shows only the paths it measured (a section whose topology is not
    /// the pod → pod one: the same-node ceilings mean nothing there).
    pub fn own_columns(mut self) -> Self {
        self.own_columns = true;
        self
    }

    /// The figure is the 99th percentile of all samples; record rounds with [`Figure::record_round`].
    pub fn pooled_p99(mut self) -> Self {
        self.pooled = Some(Vec::new());
        self
    }

    /// One more bound: called twice, the figure must meet both.
    pub fn target(mut self, against: Option<Path>, bound: f64) -> Self {
        self.targets.push(Target { against, bound });
        self
    }

    /// A round's value for `path`.
    pub fn record(&mut self, path: Path, value: f64) {
        push(&mut self.values, path, [value].into_iter().collect());
    }

    /// Every sample of a round of a pooled figure (and the round's own p99, for its spread).
    pub fn record_round(&mut self, path: Path, samples: &Samples) {
        self.record(path, samples.p99());
        if let Some(pooled) = &mut self.pooled {
            push(pooled, path, samples.clone());
        }
    }

    pub fn samples(&self, path: Path) -> Option<&Samples> {
        find(&self.values, path)
    }

    /// The figure's value for a path: the median over rounds (or the pooled p99).
    pub fn median(&self, path: Path) -> Option<f64> {
        match &self.pooled {
            Some(pooled) => Some(find(pooled, path)?.p99()),
            None => Some(self.samples(path)?.median()),
        }
    }

    /// The lowest and highest round for a path.
    pub fn spread(&self, path: Path) -> Option<(f64, f64)> {
        self.samples(path)?.range()
    }

    /// ebpf-cni's value divided by `other`'s.
    pub fn ratio(&self, other: Path) -> Option<f64> {
        Some(self.median(Path::EbpfCni)? / self.median(other)?).filter(|r| r.is_finite())
    }

    /// The lowest and highest of the per-round ratios of ebpf-cni to `other`.
    pub fn ratio_spread(&self, other: Path) -> Option<(f64, f64)> {
        let (ours, theirs) = (self.samples(Path::EbpfCni)?, self.samples(other)?);
        let ratios: Samples = ours.values().iter().zip(theirs.values()).map(|(a, b)| a / b).collect();
        ratios.range().filter(|(lo, hi)| lo.is_finite() && hi.is_finite())
    }

    /// Whether ebpf-cni meets every target (None: no target, or nothing to judge one by).
    pub fn met(&self) -> Option<bool> {
        let mut all = None;
        for target in &self.targets {
            let value = match target.against {
                Some(other) => self.ratio(other)?,
                None => self.median(Path::EbpfCni)?,
            };
            let met = match self.better {
                Better::Higher => value >= target.bound,
                Better::Lower => value <= target.bound,
            };
            all = Some(all.unwrap_or(true) && met);
        }
        all
    }

    fn target_text(&self) -> String {
        let op = if self.better == Better::Higher { "≥" } else { "≤" };
        let text = |t: &Target| match t.against {
            Some(other) => format!("{op} {:.2}× {}", t.bound, other.name()),
            None => format!("{op} {}", t.bound),
        };
        self.targets.iter().map(text).collect::<Vec<_>>().join(", ")
    }

    /// ebpf-cni and every other path measured have values, all of them finite.
    pub fn complete(&self) -> bool {
        self.samples(Path::EbpfCni).is_some()
            && self.values.iter().all(|(_, s)| !s.values().is_empty() && s.values().iter().all(|v| v.is_finite()))
    }
}

/// The Markdown table: one row per figure; every cell is "median (min–max over rounds)". The
/// pod → pod paths are columns of every table; a section measuring other paths (the Service
/// section's) gets them as more columns, and its own header when the columns change. A section
/// of [`Figure::own_columns`] figures has the columns of its measured paths only.
pub fn table(figures: &[Figure]) -> String {
    let mut out = String::new();
    let mut header: Option<Vec<Path>> = None;
    for f in figures {
        let paths = columns(figures, f.section);
        if header.as_ref() != Some(&paths) {
            if header.is_some() {
                out.push('\n');
            }
            head(&mut out, &paths);
            header = Some(paths.clone());
        }
        row(&mut out, f, &paths);
    }
    out
}

/// The columns of `section`'s figures: the pod → pod paths, then others any of them measured;
/// or, for a section of its own columns, the paths it measured.
fn columns(figures: &[Figure], section: &str) -> Vec<Path> {
    let figures: Vec<&Figure> = figures.iter().filter(|f| f.section == section).collect();
    let measured = |p: &Path| figures.iter().any(|f| f.samples(*p).is_some());
    if figures.iter().any(|f| f.own_columns) {
        return Path::EVERY.into_iter().filter(measured).collect();
    }
    let extra = Path::EVERY.into_iter().filter(|p| !Path::ALL.contains(p) && measured(p));
    Path::ALL.into_iter().chain(extra).collect()
}

/// The paths ebpf-cni is divided by: every column but its own and loopback.
fn ratio_columns(paths: &[Path]) -> impl Iterator<Item = Path> + '_ {
    paths.iter().copied().filter(|p| !matches!(p, Path::EbpfCni | Path::Loopback))
}

fn head(out: &mut String, paths: &[Path]) {
    let names = paths.iter().map(|p| p.name().to_string());
    let ratios = ratio_columns(paths).map(|p| format!("÷ {}", p.name()));
    let cells: Vec<String> = names.chain(ratios).collect();
    let _ = writeln!(out, "| section | figure | unit | {} | target | met |", cells.join(" | "));
    let _ = writeln!(out, "|---|---|---|{}---|---|", "--:|".repeat(cells.len()));
}

fn row(out: &mut String, f: &Figure, paths: &[Path]) {
    let cell = |p: Path| match (f.median(p), f.spread(p)) {
        (Some(m), Some((lo, hi))) if lo < hi => format!("{} ({}–{})", number(m), number(lo), number(hi)),
        (Some(m), _) => number(m),
        (None, _) => "–".into(),
    };
    let ratio = |p: Path| match (f.ratio(p), f.ratio_spread(p)) {
        (Some(r), Some((lo, hi))) if lo < hi => format!("{r:.2}× ({lo:.2}–{hi:.2})"),
        (Some(r), _) => format!("{r:.2}×"),
        (None, _) => "–".into(),
    };
    let met = match f.met() {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "",
    };
    let cells: Vec<String> = paths.iter().map(|p| cell(*p)).chain(ratio_columns(paths).map(ratio)).collect();
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {met} |",
        f.section,
        f.name,
        f.unit,
        cells.join(" | "),
        f.target_text()
    );
}

fn find(values: &[(Path, Samples)], path: Path) -> Option<&Samples> {
    values.iter().find(|(p, _)| *p == path).map(|(_, s)| s)
}

fn push(values: &mut Vec<(Path, Samples)>, path: Path, samples: Samples) {
    match values.iter_mut().find(|(p, _)| *p == path) {
        Some((_, all)) => all.extend(&samples),
        None => values.push((path, samples)),
    }
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

/// `1,000` for 1000.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure() -> Figure {
        let mut f = Figure::new("s", "f", "u", Better::Higher).target(Some(Path::BareVeth), 0.95);
        for (ours, veth) in [(9.0, 10.0), (10.0, 10.0), (12.0, 11.0)] {
            f.record(Path::EbpfCni, ours);
            f.record(Path::BareVeth, veth);
        }
        f
    }

    #[test]
    fn cells_show_the_median_and_the_rounds_spread() {
        let row = table(&[figure()]);
        assert!(row.contains("| 10.0 (9.00–12.0) |"), "{row}");
        // ratio of the medians 10/10, per-round ratios 0.90, 1.00, 1.09
        assert!(row.contains("| 1.00× (0.90–1.09) |"), "{row}");
        assert!(row.contains("| yes |"), "{row}");
        assert!(row.starts_with(
            "| section | figure | unit | ebpf-cni | bridge | bare veth | loopback | ÷ bridge | ÷ bare veth |"
        ));
    }

    #[test]
    fn a_section_with_more_paths_gets_their_columns_and_its_own_header() {
        let mut service = Figure::new("svc", "f", "u", Better::Lower).target(Some(Path::OwnPodToPod), 1.02);
        service.record(Path::EbpfCni, 10.1);
        service.record(Path::OwnPodToPod, 10.0);
        let text = table(&[figure(), service]);
        let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("| section")).collect();
        assert_eq!(heads.len(), 2, "{text}");
        assert!(
            heads[1].ends_with("| ebpf-cni pod → pod | ÷ bridge | ÷ bare veth | ÷ ebpf-cni pod → pod | target | met |")
        );
        assert!(text.lines().last().unwrap().contains("| 1.01× | ≤ 1.02× ebpf-cni pod → pod | yes |"), "{text}");
    }

    #[test]
    fn a_section_of_its_own_columns_shows_only_the_paths_it_measured() {
        let mut across = Figure::new("x", "f", "u", Better::Lower).own_columns().target(Some(Path::Routed), 1.05);
        for (path, value) in
            [(Path::EbpfCni, 21.0), (Path::Bridge, 24.0), (Path::BareNodes, 16.0), (Path::Routed, 20.0)]
        {
            across.record(path, value);
        }
        let mut only_ours = Figure::new("x", "g", "ns", Better::Lower).own_columns();
        only_ours.record(Path::EbpfCni, 50.0);
        let text = table(&[figure(), across, only_ours]);
        let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("| section")).collect();
        assert_eq!(heads.len(), 2, "{text}");
        assert_eq!(
            heads[1],
            "| section | figure | unit | ebpf-cni | bridge | bare node → node | routed (1 hop, no plugin) | ÷ bridge \
             | ÷ bare node → node | ÷ routed (1 hop, no plugin) | target | met |"
        );
        let rows: Vec<&str> = text.lines().skip_while(|l| *l != heads[1]).skip(2).collect();
        assert!(
            rows[0].ends_with(
                "| 21.0 | 24.0 | 16.0 | 20.0 | 0.88× | 1.31× | 1.05× | ≤ 1.05× routed (1 hop, no plugin) | yes |"
            ),
            "{text}"
        );
        assert!(rows[1].ends_with("| 50.0 | – | – | – | – | – | – |  |  |"), "{text}");
        let separator = text.lines().skip_while(|l| *l != heads[1]).nth(1).unwrap();
        assert_eq!(separator.matches('|').count(), heads[1].matches('|').count(), "{text}");
    }

    #[test]
    fn two_targets_are_met_only_together() {
        let mut f = figure().target(Some(Path::Bridge), 1.0);
        f.record(Path::Bridge, 11.0);
        let text = table(&[f]);
        assert!(text.contains("| ≥ 0.95× bare veth, ≥ 1.00× bridge | **no** |"), "{text}");
    }

    #[test]
    fn pooled_p99_is_over_every_sample_and_its_spread_over_rounds() {
        let mut f = Figure::new("s", "f", "ms", Better::Lower).pooled_p99();
        f.record_round(Path::EbpfCni, &[1.0, 2.0, 3.0].into_iter().collect());
        f.record_round(Path::EbpfCni, &[4.0, 5.0, 9.0].into_iter().collect());
        assert_eq!(f.median(Path::EbpfCni), Some(9.0));
        assert_eq!(f.spread(Path::EbpfCni), Some((3.0, 9.0)));
    }
}
