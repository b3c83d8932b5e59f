//! The run as one SVG: a heading per section, a group of bars per figure (a bar per path, scaled
//! to the group's largest value or round), the median printed past the end of each bar and its
//! whisker, a whisker from the lowest to the highest round (when they differ), and which way is
//! better under the figure's name. SVG has no text measurement, so text widths are estimated from
//! the characters (generously, for DejaVu Sans, the usual `sans-serif`): the label column is as
//! wide as the longest label needs, up to a cap past which labels wrap, and the SVG as wide as its
//! columns.
use std::fmt::Write as _;

use crate::{
    report::{Better, Figure, number},
    topology::Path,
};

const MARGIN: f64 = 8.0;
/// Past this a label wraps onto more lines instead of widening the chart.
const LABEL_MAX_W: f64 = 400.0;
const GAP: f64 = 14.0;
const BAR_W: f64 = 420.0;
const BAR_H: f64 = 13.0;
const BAR_STEP: f64 = BAR_H + 2.0;
const LABEL_SIZE: f64 = 12.0;
const LABEL_LINE: f64 = 15.0;
const NOTE_SIZE: f64 = 10.0;
const VALUE_SIZE: f64 = 10.0;
const SECTION_SIZE: f64 = 13.0;
const LEGEND_SIZE: f64 = 11.0;
const TITLE_SIZE: f64 = 15.0;

fn colour(path: Path) -> &'static str {
    match path {
        Path::EbpfCni => "#2563eb",
        Path::Bridge => "#ea580c",
        Path::BareVeth => "#6b7280",
        Path::Loopback => "#c4c8ce",
        Path::EbpfCniKubeProxy => "#93c5fd",
        Path::BridgeNft => "#fdba74",
        Path::OwnPodToPod => "#1e3a8a",
        Path::BareNodes => "#374151",
        Path::Floor => "#16a34a",
        Path::Routed => "#7c3aed",
        Path::NoPolicy => "#60a5fa",
        Path::Previous => "#a3a3a3",
    }
}

/// The estimated width of `text` at `size` px, from DejaVu Sans' advance widths (the usual
/// `sans-serif`) rounded up by class of character, and 5 % more for fonts a little wider; bold
/// text 10 % more.
fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let ems: f64 = text.chars().map(em).sum();
    ems * size * 1.05 * if bold { 1.1 } else { 1.0 }
}

/// A character's advance in em.
fn em(c: char) -> f64 {
    match c {
        ' ' | 'i' | 'l' | 'j' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' => 0.33,
        'f' | 't' | 'r' | 'I' | '(' | ')' | '[' | ']' | '/' | '-' => 0.42,
        'm' | 'w' | 'M' | 'W' | '%' | '@' => 1.0,
        '→' | '÷' | '×' | '+' | '=' | '<' | '>' | '≤' | '≥' | '~' => 0.84,
        c if c.is_uppercase() => 0.78,
        _ => 0.64,
    }
}

/// `text` in lines of at most `width` px, broken between words; a word too long for a line
/// alone is cut where the line ends.
fn wrap(text: &str, size: f64, width: f64) -> Vec<String> {
    let fits = |s: &str| text_width(s, size, false) <= width;
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let joined = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        if fits(&joined) {
            line = joined;
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        let mut rest = word.to_string();
        while !fits(&rest) {
            let cut =
                (1..rest.chars().count()).rev().find(|n| fits(&rest.chars().take(*n).collect::<String>())).unwrap_or(1);
            let head: String = rest.chars().take(cut).collect();
            rest = rest.chars().skip(cut).collect();
            lines.push(head);
        }
        line = rest;
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

fn label(f: &Figure) -> String {
    format!("{} ({})", f.name, f.unit)
}

fn better(f: &Figure) -> &'static str {
    if f.better == Better::Higher { "higher is better" } else { "lower is better" }
}

/// One figure's bars: per path measured, its median and its rounds' spread, on a scale whose end
/// (`BAR_W`) is the largest median or highest round, so that no whisker runs past it.
struct Group {
    bars: Vec<Bar>,
    max: f64,
}

/// A path's median and the lowest and highest of its rounds.
struct Bar {
    path: Path,
    median: f64,
    spread: Option<(f64, f64)>,
}

impl Group {
    fn of(f: &Figure) -> Self {
        let bars: Vec<Bar> = Path::EVERY
            .iter()
            .filter_map(|p| Some(Bar { path: *p, median: f.median(*p)?, spread: f.spread(*p) }))
            .collect();
        let ends = bars.iter().flat_map(|b| [Some(b.median), b.spread.map(|(_, hi)| hi)]);
        let max = ends.flatten().filter(|v| v.is_finite()).fold(0.0, f64::max);
        Self { bars, max }
    }

    /// Where a value falls, in px from the bars' left edge.
    fn x(&self, value: f64) -> f64 {
        if self.max > 0.0 && value.is_finite() { (value / self.max * BAR_W).clamp(0.0, BAR_W) } else { 0.0 }
    }

    /// Where a bar's median is printed: past the bar and past its whisker.
    fn value_x(&self, median: f64, spread: Option<(f64, f64)>) -> f64 {
        let whisker_end = spread.map_or(0.0, |(_, hi)| self.x(hi));
        self.x(median).max(1.0).max(whisker_end) + 4.0
    }

    /// The farthest right the group draws anything, in px from the bars' left edge.
    fn right(&self) -> f64 {
        let value_end = |b: &Bar| self.value_x(b.median, b.spread) + text_width(&number(b.median), VALUE_SIZE, false);
        self.bars.iter().map(value_end).fold(BAR_W, f64::max)
    }
}

/// The columns: labels from `MARGIN` to `bars_x - GAP`, bars from `bars_x`, and the whole width.
struct Columns {
    label_w: f64,
    bars_x: f64,
    width: f64,
}

impl Columns {
    fn of(title: &str, figures: &[Figure], legend_w: f64) -> Self {
        let longest = figures
            .iter()
            .map(|f| text_width(&label(f), LABEL_SIZE, false).max(text_width(better(f), NOTE_SIZE, false)))
            .fold(0.0, f64::max);
        let label_w = longest.min(LABEL_MAX_W).ceil();
        let bars_x = MARGIN + label_w + GAP;
        let right = figures.iter().map(|f| Group::of(f).right()).fold(BAR_W, f64::max);
        let sections = figures.iter().map(|f| text_width(f.section, SECTION_SIZE, true)).fold(0.0, f64::max);
        let width = (bars_x + right + MARGIN)
            .max(MARGIN * 2.0 + text_width(title, TITLE_SIZE, true))
            .max(MARGIN * 2.0 + sections)
            .max(MARGIN * 2.0 + legend_w.min(bars_x + BAR_W));
        Self { label_w, bars_x, width: width.ceil() }
    }
}

pub fn svg(title: &str, figures: &[Figure]) -> String {
    let measured: Vec<Path> =
        Path::EVERY.into_iter().filter(|p| figures.iter().any(|f| f.samples(*p).is_some())).collect();
    let entry_w = |p: &Path| 16.0 + text_width(p.name(), LEGEND_SIZE, false) + 18.0;
    let columns = Columns::of(title, figures, measured.iter().map(entry_w).sum());

    // The legend: the paths this run measured, left to right, onto a new line when the next
    // would not fit.
    let mut legend = String::new();
    let (mut x, mut y) = (MARGIN, 30.0);
    for path in &measured {
        if x > MARGIN && x + entry_w(path) > columns.width - MARGIN {
            (x, y) = (MARGIN, y + 18.0);
        }
        let _ = write!(
            legend,
            r##"<rect x="{x:.1}" y="{y:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="{LEGEND_SIZE}">{}</text>"##,
            colour(*path),
            x + 16.0,
            y + 10.0,
            path.name()
        );
        x += entry_w(path);
    }

    let mut body = String::new();
    let mut y = y + 26.0;
    let mut section = None;
    for f in figures {
        if section != Some(f.section) {
            section = Some(f.section);
            let _ = write!(
                body,
                r##"<text x="{MARGIN}" y="{:.1}" font-size="{SECTION_SIZE}" font-weight="bold">{}</text>"##,
                y + 13.0,
                escape(f.section)
            );
            y += 22.0;
        }
        let lines = wrap(&label(f), LABEL_SIZE, columns.label_w);
        for (i, line) in lines.iter().enumerate() {
            let _ = write!(
                body,
                r##"<text x="{MARGIN}" y="{:.1}" font-size="{LABEL_SIZE}">{}</text>"##,
                y + 11.0 + i as f64 * LABEL_LINE,
                escape(line)
            );
        }
        let _ = write!(
            body,
            r##"<text x="{MARGIN}" y="{:.1}" font-size="{NOTE_SIZE}" fill="#555">{}</text>"##,
            y + 11.0 + lines.len() as f64 * LABEL_LINE - 1.0,
            better(f)
        );
        let group = Group::of(f);
        for (i, Bar { path, median, spread }) in group.bars.iter().enumerate() {
            let top = y + i as f64 * BAR_STEP;
            let mid = top + BAR_H / 2.0;
            let _ = write!(
                body,
                r##"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{BAR_H}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="{VALUE_SIZE}">{}</text>"##,
                columns.bars_x,
                group.x(*median).max(1.0),
                colour(*path),
                columns.bars_x + group.value_x(*median, *spread),
                top + BAR_H - 2.0,
                number(*median)
            );
            if let Some((lo, hi)) = spread.filter(|(lo, hi)| group.max > 0.0 && lo < hi) {
                let (x1, x2) = (columns.bars_x + group.x(lo), columns.bars_x + group.x(hi));
                let _ = write!(
                    body,
                    r##"<path d="M{x1:.1} {:.1}V{:.1}M{x1:.1} {mid:.1}H{x2:.1}M{x2:.1} {:.1}V{:.1}" stroke="#111" stroke-width="1.5" fill="none"/>"##,
                    mid - 3.0,
                    mid + 3.0,
                    mid - 3.0,
                    mid + 3.0
                );
            }
        }
        let label_h = (lines.len() + 1) as f64 * LABEL_LINE;
        let height = label_h.max(group.bars.len() as f64 * BAR_STEP) + 10.0;
        let _ = write!(
            body,
            r##"<line x1="{MARGIN}" x2="{:.1}" y1="{1:.1}" y2="{1:.1}" stroke="#e5e7eb"/>"##,
            columns.width - MARGIN,
            y + height - 5.0
        );
        y += height;
    }
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{:.0}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{MARGIN}" y="20" font-size="{TITLE_SIZE}" font-weight="bold">{}</text>{legend}{body}</svg>
"##,
        columns.width,
        y + 10.0,
        escape(title)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of a results table, each cell's lowest round, median and highest round
    /// recorded as three rounds (which keeps its median and spread).
    fn figures_of(table: &str) -> Vec<Figure> {
        let mut paths: Vec<Option<Path>> = Vec::new();
        let mut figures = Vec::new();
        for row in table.lines().filter(|l| l.starts_with("| ") && !l.starts_with("|---")) {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            if cells[0] == "section" {
                paths = cells.iter().map(|c| Path::EVERY.into_iter().find(|p| p.name() == *c)).collect();
                continue;
            }
            let better = if cells[1].contains("RTT") || cells[2] == "ms" { Better::Lower } else { Better::Higher };
            let section: &'static str = Box::leak(cells[0].to_string().into_boxed_str());
            let unit: &'static str = Box::leak(cells[2].to_string().into_boxed_str());
            let mut f = Figure::new(section, cells[1], unit, better);
            for (path, cell) in paths.iter().zip(&cells).filter_map(|(p, c)| Some(((*p)?, c))) {
                let numbers: Vec<f64> = cell.split([' ', '(', ')', '–']).filter_map(|n| n.parse().ok()).collect();
                match numbers[..] {
                    [median, lo, hi] => [lo, median, hi].into_iter().for_each(|v| f.record(path, v)),
                    [median] => f.record(path, median),
                    _ => {}
                }
            }
            figures.push(f);
        }
        figures
    }

    #[test]
    fn every_label_fits_its_column_and_every_whisker_and_value_the_width() {
        let figures = figures_of(include_str!("../results/2026-11-27-service-own-lb.md"));
        assert_eq!(figures.len(), 12);
        let svg = svg("ebpf-cni vs bridge, 2026-11-27", &figures);
        if let Some(out) = std::env::var_os("ECNI_CHART_OUT") {
            std::fs::write(out, &svg).unwrap(); // to look at it
        }
        let columns = Columns::of("", &figures, 0.0);
        assert!(columns.label_w <= LABEL_MAX_W);
        for f in &figures {
            for line in wrap(&label(f), LABEL_SIZE, columns.label_w) {
                assert!(text_width(&line, LABEL_SIZE, false) <= columns.label_w, "{line}");
            }
            let group = Group::of(f);
            for bar in &group.bars {
                let (_, hi) = bar.spread.unwrap_or((bar.median, bar.median));
                assert!(group.x(hi) <= BAR_W && group.x(bar.median) <= BAR_W, "{}", f.name);
            }
            assert!(columns.bars_x + group.right() <= columns.width - MARGIN, "{}", f.name);
        }
        assert!(svg.starts_with(&format!(r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}""#, columns.width)));
    }

    #[test]
    fn a_whisker_past_every_median_sets_the_scale_and_the_value_goes_past_it() {
        let mut f = Figure::new("s", "f", "u", Better::Higher);
        for v in [10.0, 11.0, 40.0] {
            f.record(Path::EbpfCni, v);
        }
        f.record(Path::Bridge, 20.0);
        let group = Group::of(&f);
        assert_eq!(group.max, 40.0);
        assert_eq!(group.x(40.0), BAR_W);
        assert_eq!(group.value_x(11.0, Some((10.0, 40.0))), BAR_W + 4.0);
    }

    #[test]
    fn short_labels_make_a_narrow_column_and_long_ones_wrap_at_the_cap() {
        let short = Figure::new("s", "TCP", "Gbit/s", Better::Higher);
        let long = Figure::new("s", "an EndpointSlice event into the datapath, ".repeat(4), "ms", Better::Lower);
        let narrow = Columns::of("", &[short], 0.0);
        assert!(narrow.label_w < 120.0, "{}", narrow.label_w);
        let lines = wrap(&label(&long), LABEL_SIZE, LABEL_MAX_W);
        assert!(lines.len() > 1 && lines.iter().all(|l| text_width(l, LABEL_SIZE, false) <= LABEL_MAX_W));
        assert_eq!(lines.join(" "), label(&long).split_whitespace().collect::<Vec<_>>().join(" "));
        assert_eq!(wrap("x".repeat(100).as_str(), 10.0, 70.0).len(), 10);
    }
}
