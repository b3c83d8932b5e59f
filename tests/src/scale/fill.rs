//! A node filled with pods and emptied again, ADDs and DELs `width` at a time and some killed:
//! no address given twice, every pod that was added answers a ping from one of them and a
//! sample of them a ping from the node, GC with the added pods valid leaves exactly them, and
//! after their DELs and a GC with none valid nothing is left.
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{
    faults::Killer,
    reach, state,
    waves::{After, duplicates, in_waves},
};
use crate::Testbed;

/// Pods the node pings. The node resolves each pod it talks to (a pod resolves nothing: its
/// gateway's entry is permanent), and resolved entries count against a neighbour table limit
/// that every namespace of the machine shares (gc_thresh3, 1,024 by default): a thousand would
/// crowd out the machine's own.
pub const NODE_SAMPLE: usize = 64;

#[derive(Clone, Debug, Default)]
pub struct FillFigures {
    /// Pods whose ADD was started, and of those, added (ADD not killed, nothing failed).
    pub pods: usize,
    pub added: usize,
    pub duplicates: usize,
    /// Pings from the first added pod to every other one: (answered, sent).
    pub from_pod: (usize, usize),
    /// Pings from the node to the first [`NODE_SAMPLE`] added pods: (answered, sent).
    pub from_node: (usize, usize),
    pub add_wall: Duration,
    pub del_wall: Duration,
    /// The plugin's summary of each GC.
    pub gc: Vec<String>,
    /// What did not match after the first GC, and what was left after the last.
    pub leaks: Vec<String>,
    /// Verbs that failed without being killed, and why.
    pub failures: Vec<String>,
}

/// Fills `tb` with `count` new pods, `width` ADDs at a time, then empties it the same way.
pub fn fill_and_empty(tb: &mut Testbed, killer: &Killer, count: usize, width: usize) -> Result<FillFigures> {
    let pods: Vec<usize> = (0..count).map(|_| tb.new_pod()).collect::<Result<_>>()?;
    let conf = tb.conf("1.1.0");
    let mut figures = FillFigures { pods: count, ..FillFigures::default() };

    let started = Instant::now();
    let added = in_waves(tb, killer, "ADD", &pods, &conf, &[], width)?;
    figures.add_wall = started.elapsed();
    let up: Vec<(usize, std::net::Ipv4Addr)> = added
        .iter()
        .filter_map(|o| match o.after {
            After::Added(ip) => Some((o.pod, ip)),
            _ => None,
        })
        .collect();
    figures.added = up.len();
    figures.duplicates = duplicates(up.iter().map(|(_, ip)| *ip));
    if let Some(((prober, _), others)) = up.split_first() {
        let others: Vec<_> = others.iter().map(|(_, ip)| *ip).collect();
        let silent = reach::unanswered(&tb.pods[*prober].netns.name, &others)?.len();
        figures.from_pod = (others.len() - silent, others.len());
    }
    let sample: Vec<_> = up.iter().take(NODE_SAMPLE).map(|(_, ip)| *ip).collect();
    figures.from_node = (sample.len() - reach::unanswered(&tb.node.name, &sample)?.len(), sample.len());

    let valid: Vec<usize> = up.iter().map(|(pod, _)| *pod).collect();
    figures.gc.push(tb.gc_report(&valid)?);
    figures.leaks.extend(state::mismatches(tb, valid.len())?);

    let started = Instant::now();
    let deleted = in_waves(tb, killer, "DEL", &valid, &conf, &[], width)?;
    figures.del_wall = started.elapsed();
    figures.gc.push(tb.gc_report(&[])?);
    figures.leaks.extend(tb.leftovers()?);
    for outcome in added.iter().chain(&deleted) {
        if let After::Failed(why) = &outcome.after {
            figures.failures.push(why.clone());
        }
    }
    Ok(figures)
}
