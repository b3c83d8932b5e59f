//! The run as one SVG: a row per figure, a bar per path scaled to the row's largest value, the
//! median printed at the end of each bar, a whisker across each bar from its lowest to its
//! highest round, and which way is better beside the figure's name.
use std::fmt::Write as _;

use crate::{
    report::{Better, Figure, number},
    topology::Path,
};

const LABEL_W: usize = 360;
const BAR_W: f64 = 420.0;
const BAR_H: usize = 13;
const WIDTH: usize = LABEL_W + BAR_W as usize + 90;

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
    }
}

pub fn svg(title: &str, figures: &[Figure]) -> String {
    let mut body = String::new();
    let mut y = 60;
    for f in figures {
        let paths: Vec<(Path, f64)> = Path::EVERY.iter().filter_map(|p| Some((*p, f.median(*p)?))).collect();
        let highest_round = Path::EVERY.iter().filter_map(|p| Some(f.spread(*p)?.1));
        let max = paths.iter().map(|(_, v)| *v).chain(highest_round).fold(0.0, f64::max);
        let height = paths.len() * (BAR_H + 2) + 14;
        let better = if f.better == Better::Higher { "higher is better" } else { "lower is better" };
        let _ = write!(
            body,
            r##"<text x="8" y="{}" font-size="12">{} · {} ({})</text><text x="8" y="{}" font-size="10" fill="#555">{better}</text>"##,
            y + 12,
            escape(f.section),
            escape(&f.name),
            escape(f.unit),
            y + 25
        );
        for (i, (path, value)) in paths.iter().enumerate() {
            let top = y + i * (BAR_H + 2);
            let w = if max > 0.0 { (value / max * BAR_W).max(1.0) } else { 1.0 };
            let _ = write!(
                body,
                r##"<rect x="{LABEL_W}" y="{top}" width="{w:.1}" height="{BAR_H}" fill="{}"/><text x="{:.1}" y="{}" font-size="10">{}</text>"##,
                colour(*path),
                LABEL_W as f64 + w + 4.0,
                top + BAR_H - 2,
                number(*value)
            );
            if let Some((lo, hi)) = f.spread(*path).filter(|_| max > 0.0) {
                let (x1, x2) = (LABEL_W as f64 + lo / max * BAR_W, LABEL_W as f64 + hi / max * BAR_W);
                let mid = top + BAR_H / 2;
                let _ = write!(
                    body,
                    r##"<line x1="{x1:.1}" x2="{x2:.1}" y1="{mid}" y2="{mid}" stroke="#111" stroke-width="1.5"/>"##
                );
            }
        }
        let _ = write!(body, r##"<line x1="8" x2="{WIDTH}" y1="{0}" y2="{0}" stroke="#e5e7eb"/>"##, y + height - 6);
        y += height;
    }
    let mut legend = String::new();
    // Only the paths this run measured, from the left edge: all seven fit the width there.
    let measured = Path::EVERY.into_iter().filter(|p| figures.iter().any(|f| f.samples(*p).is_some()));
    for (i, path) in measured.enumerate() {
        let x = 8 + i * 120;
        let _ = write!(
            legend,
            r##"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40" font-size="11">{}</text>"##,
            colour(path),
            x + 16,
            path.name()
        );
    }
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="8" y="20" font-size="15" font-weight="bold">{}</text>{legend}{body}</svg>
"##,
        y + 10,
        escape(title)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
