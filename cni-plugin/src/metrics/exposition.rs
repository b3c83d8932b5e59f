//! The Prometheus text exposition format, version 0.0.4: per family a `# HELP` and a `# TYPE`
//! line, then its samples, all together (a parser takes samples of a name seen before under
//! another family's header as a second family). Samples are added in any order and grouped here.
use std::fmt::Write as _;

/// The `Content-Type` of a page in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A sample's value. Counters stay integers: a float would round them past 2^53.
#[derive(Clone, Copy, Debug)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Self::Int(v as u64)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Self::Int(v.into())
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Float(v)
    }
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Each sample's name suffix (a histogram's `_bucket`, `_sum`, `_count`; else empty), its
    /// rendered label set (`{a="x"}` or empty) and its value.
    samples: Vec<(&'static str, String, Value)>,
}

/// A page being built: families in the order they first got a sample.
#[derive(Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn counter(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        value: impl Into<Value>,
    ) {
        self.add(name, help, Kind::Counter, labels, value.into());
    }

    pub fn gauge(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], value: impl Into<Value>) {
        self.add(name, help, Kind::Gauge, labels, value.into());
    }

    /// A histogram: `buckets` are (upper bound, observations at most that), cumulative and in
    /// increasing order, as the format wants; the `+Inf` bucket is `count`.
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) {
        let bounds = buckets.iter().map(|&(le, n)| (render_value(Value::Float(le)), n));
        for (le, n) in bounds.chain(std::iter::once(("+Inf".to_string(), count))) {
            let with_le: Vec<(&str, &str)> = labels.iter().copied().chain([("le", le.as_str())]).collect();
            self.add_sample(name, help, Kind::Histogram, "_bucket", &with_le, Value::Int(n));
        }
        self.add_sample(name, help, Kind::Histogram, "_sum", labels, Value::Float(sum));
        self.add_sample(name, help, Kind::Histogram, "_count", labels, Value::Int(count));
    }

    fn add(&mut self, name: &'static str, help: &'static str, kind: Kind, labels: &[(&str, &str)], value: Value) {
        self.add_sample(name, help, kind, "", labels, value);
    }

    fn add_sample(
        &mut self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        suffix: &'static str,
        labels: &[(&str, &str)],
        value: Value,
    ) {
        let sample = (suffix, render_labels(labels), value);
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(family) => {
                debug_assert!(family.kind == kind && family.help == help, "{name} declared twice, differently");
                family.samples.push(sample);
            }
            None => self.families.push(Family { name, help, kind, samples: vec![sample] }),
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for family in &self.families {
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {} {}", family.name, escape(family.help, false));
            let _ = writeln!(out, "# TYPE {} {kind}", family.name);
            for (suffix, labels, value) in &family.samples {
                let _ = writeln!(out, "{}{suffix}{labels} {}", family.name, render_value(*value));
            }
        }
        out
    }
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v, true))).collect();
    format!("{{{}}}", pairs.join(","))
}

/// Backslash and newline are escaped in HELP text; in label values the double quote too.
fn escape(text: &str, quote: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

fn render_value(value: Value) -> String {
    match value {
        Value::Int(v) => v.to_string(),
        Value::Float(v) if v.is_nan() => "NaN".into(),
        Value::Float(v) if v.is_infinite() => if v > 0.0 { "+Inf" } else { "-Inf" }.into(),
        Value::Float(v) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::Exposition;

    #[test]
    fn families_group_their_samples_under_one_header() {
        let mut page = Exposition::default();
        page.gauge("up", "1 when read.", &[("network", "a")], 1u64);
        page.counter("drops_total", "Drops.", &[("network", "a"), ("reason", "x")], 3u64);
        page.gauge("up", "1 when read.", &[("network", "b")], 0u64);
        page.gauge("agent_routes", "Routes.", &[], 2usize);
        assert_eq!(
            page.render(),
            "# HELP up 1 when read.\n# TYPE up gauge\nup{network=\"a\"} 1\nup{network=\"b\"} 0\n\
             # HELP drops_total Drops.\n# TYPE drops_total counter\ndrops_total{network=\"a\",reason=\"x\"} 3\n\
             # HELP agent_routes Routes.\n# TYPE agent_routes gauge\nagent_routes 2\n"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut page = Exposition::default();
        page.gauge("up", "a \\ b \"quoted\"\nnext", &[("network", "we\"ird\\net\nname")], 0.5);
        let text = page.render();
        assert!(text.starts_with("# HELP up a \\\\ b \"quoted\"\\nnext\n"), "{text}");
        assert!(text.ends_with("up{network=\"we\\\"ird\\\\net\\nname\"} 0.5\n"), "{text}");
    }

    #[test]
    fn floats_render_as_go_parses_them() {
        let mut page = Exposition::default();
        page.gauge("a", "A.", &[("v", "inf")], f64::INFINITY);
        page.gauge("a", "A.", &[("v", "nan")], f64::NAN);
        page.gauge("a", "A.", &[("v", "ts")], 1_764_000_000.25);
        let text = page.render();
        assert!(text.contains("a{v=\"inf\"} +Inf\na{v=\"nan\"} NaN\na{v=\"ts\"} 1764000000.25\n"), "{text}");
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_then_sum_and_count() {
        let mut page = Exposition::default();
        page.histogram("sync_seconds", "Syncs.", &[("network", "a")], &[(0.001, 1), (0.01, 3)], 0.0125, 4);
        assert_eq!(
            page.render(),
            "# HELP sync_seconds Syncs.\n# TYPE sync_seconds histogram\n\
             sync_seconds_bucket{network=\"a\",le=\"0.001\"} 1\n\
             sync_seconds_bucket{network=\"a\",le=\"0.01\"} 3\n\
             sync_seconds_bucket{network=\"a\",le=\"+Inf\"} 4\n\
             sync_seconds_sum{network=\"a\"} 0.0125\nsync_seconds_count{network=\"a\"} 4\n"
        );
    }

    #[test]
    fn a_page_without_samples_is_empty() {
        assert_eq!(Exposition::default().render(), "");
    }
}
