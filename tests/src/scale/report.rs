//! The run's figures as a Markdown table (printed by the test, written by the bench).
use std::fmt::{self, Display, Formatter};

use super::{ScaleFigures, fill::FillFigures};

/// Figures over this many first and last churn cycles.
pub const WINDOW: usize = 100;

impl Display for ScaleFigures {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        writeln!(f, "| figure | value |\n|---|---|")?;
        fill_rows(f, &format!("{} pods at once", s.at_once), &self.at_once)?;
        let c = &self.churn;
        let window = WINDOW.min(c.cycles);
        row(f, "churn: ADD/DEL cycles", format!("{} ({} at once), in {:.1?}", c.cycles, s.batch, c.wall))?;
        row(f, "churn: duplicate addresses", c.duplicates)?;
        row(f, "churn: leaks", list(&c.leaks))?;
        row(f, "churn: failed verbs (not killed)", list(&c.failures))?;
        row(f, format!("churn: plugin peak RSS per verb, first {window} cycles"), c.plugin_rss.first(window))?;
        row(f, format!("churn: plugin peak RSS per verb, last {window} cycles"), c.plugin_rss.last(window))?;
        row(f, format!("churn: agent VmRSS, first {window} cycles"), c.agent_rss.first(window))?;
        row(f, format!("churn: agent VmRSS, last {window} cycles"), c.agent_rss.last(window))?;
        row(
            f,
            "churn: agent VmRSS at the start, each quarter and the end (KiB)",
            format!("{:?}", c.agent_rss.quarters()),
        )?;
        let t = &c.traffic;
        row(
            f,
            "churn: masqueraded UDP questions answered",
            format!(
                "{} of {}, longest silence {:.0?}; unanswered ones asked at {:.1?}; the server saw {}",
                t.answered,
                t.asked,
                t.longest_silence,
                t.lost_at,
                t.translations.iter().map(|(from, at)| format!("{from} from {at:.1?}")).collect::<Vec<_>>().join(", ")
            ),
        )?;
        let drops: Vec<String> = c.drops.iter().map(|(reason, n)| format!("reason {reason}: {n}")).collect();
        row(f, "churn: datapath drops (METRICS)", list(&drops))?;
        row(f, "churn: GC", c.gc.join("; "))?;
        fill_rows(f, &format!("{} pods on one node", s.pods), &self.node)?;
        let k = &self.kills;
        row(
            f,
            "SIGKILLs",
            format!(
                "{} ADDs and {} DELs killed (1 verb in {} chosen, {} at named crash points); {} followed by DEL, {} left to GC",
                k.adds_killed, k.dels_killed, s.kill_one_in, k.at_crash_points, k.followed_by_del, k.left_to_gc
            ),
        )?;
        row(f, "namespaces left", list(&self.namespaces_left))?;
        row(f, "wall time", format!("{:.1?} (seed {})", self.wall, self.seed))
    }
}

fn fill_rows(f: &mut Formatter<'_>, phase: &str, fill: &FillFigures) -> fmt::Result {
    row(
        f,
        format!("{phase}: added"),
        format!("{} of {} in {:.1?}, deleted in {:.1?}", fill.added, fill.pods, fill.add_wall, fill.del_wall),
    )?;
    row(f, format!("{phase}: duplicate addresses"), fill.duplicates)?;
    let (answered, sent) = fill.from_pod;
    row(f, format!("{phase}: reachable from one pod (ping to each other pod)"), format!("{answered} of {sent}"))?;
    let (answered, sent) = fill.from_node;
    row(f, format!("{phase}: reachable from the node (ping, first {sent} pods)"), format!("{answered} of {sent}"))?;
    row(f, format!("{phase}: leaks"), list(&fill.leaks))?;
    row(f, format!("{phase}: failed verbs (not killed)"), list(&fill.failures))?;
    row(f, format!("{phase}: GC"), fill.gc.join("; "))
}

fn row(f: &mut Formatter<'_>, name: impl Display, value: impl Display) -> fmt::Result {
    writeln!(f, "| {name} | {value} |")
}

fn list(items: &[String]) -> String {
    if items.is_empty() { "0".to_string() } else { format!("{}: {}", items.len(), items.join("; ")) }
}
