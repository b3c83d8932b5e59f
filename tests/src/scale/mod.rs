//! The scale and fault run (shared by `tests/tests/scale.rs`, reduced, and the bench's `scale`
//! section, full): pods added and deleted all at once, ADD/DEL churn on a busy masquerading
//! node, a node with many pods, and SIGKILLs at random points of all of it, each phase ending
//! with GC. Every phase counts duplicates and leaks; the run reports them with memory, reach
//! and wall times.
pub mod busy_churn;
pub mod churn;
pub mod faults;
pub mod fill;
pub mod masq_stream;
pub mod memory;
pub mod reach;
mod report;
pub use report::WINDOW;
pub mod rng;
pub mod state;
pub mod waves;

use std::time::{Duration, Instant};

use anyhow::Result;

use self::{busy_churn::ChurnFigures, faults::Tally, fill::FillFigures, rng::Rng};
use crate::{Cluster, Plugin, Testbed};

/// How much the run does.
#[derive(Clone, Debug)]
pub struct ScaleSettings {
    /// Pods added at once, then deleted at once.
    pub at_once: usize,
    /// ADD/DEL cycles of the churn, `batch` pods at once.
    pub cycles: usize,
    pub batch: usize,
    /// Pods on one node, added and deleted `width` at a time.
    pub pods: usize,
    pub width: usize,
    /// One verb in this many is killed (0: none).
    pub kill_one_in: u32,
}

impl ScaleSettings {
    /// `cargo xtask bench -- --only scale`.
    pub fn full() -> Self {
        Self { at_once: 64, cycles: 1_000, batch: 10, pods: 1_000, width: 16, kill_one_in: 20 }
    }

    /// The CI test's: every phase, fewer cycles and pods, more kills.
    pub fn reduced() -> Self {
        Self { at_once: 64, cycles: 200, batch: 10, pods: 250, width: 16, kill_one_in: 10 }
    }
}

/// Everything the run measured.
#[derive(Debug)]
pub struct ScaleFigures {
    pub settings: ScaleSettings,
    pub seed: u64,
    pub at_once: FillFigures,
    pub churn: ChurnFigures,
    pub node: FillFigures,
    pub kills: Tally,
    /// Namespaces of the run left once its nodes were gone.
    pub namespaces_left: Vec<String>,
    pub wall: Duration,
}

impl ScaleFigures {
    /// Every duplicate address, leak and unexpected failure, and every added pod that did not
    /// answer: empty when the run passed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (phase, fill) in [("at once", &self.at_once), ("one node", &self.node)] {
            if fill.duplicates > 0 {
                problems.push(format!("{phase}: {} duplicate addresses", fill.duplicates));
            }
            for (from, (answered, sent)) in [("a pod", fill.from_pod), ("the node", fill.from_node)] {
                if answered != sent {
                    problems.push(format!("{phase}: {} of {sent} pods did not answer {from}", sent - answered));
                }
            }
            problems.extend(fill.leaks.iter().map(|l| format!("{phase}: leak: {l}")));
            problems.extend(fill.failures.iter().map(|f| format!("{phase}: failed: {f}")));
        }
        if self.churn.duplicates > 0 {
            problems.push(format!("churn: {} duplicate addresses", self.churn.duplicates));
        }
        if self.churn.traffic.translations.len() > 1 {
            problems.push(format!(
                "churn: the resident pod's flow was translated anew: {:?}",
                self.churn.traffic.translations
            ));
        }
        problems.extend(self.churn.leaks.iter().map(|l| format!("churn: leak: {l}")));
        problems.extend(self.churn.failures.iter().map(|f| format!("churn: failed: {f}")));
        problems.extend(self.namespaces_left.iter().map(|n| format!("namespace left: {n}")));
        problems
    }
}

/// Runs every phase with `plugin` under `settings`, on throwaway nodes tagged `tag`.
pub fn run(settings: &ScaleSettings, plugin: &Plugin, tag: &str) -> Result<ScaleFigures> {
    let started = Instant::now();
    let rng = Rng::from_env();
    let seed = rng.seed();
    eprintln!("scale: seed {seed} (EBPF_CNI_SEED={seed} replays the kills)");
    let mut run_ids = Vec::new();

    let mut tb = Testbed::with_plugin(&format!("{tag}a"), "10.229.0.0/24", plugin.clone())?;
    run_ids.push(tb.run_id.clone());
    let killer = faults::Killer::new(rng, settings.kill_one_in, &tb)?;
    let at_once = fill::fill_and_empty(&mut tb, &killer, settings.at_once, settings.at_once)?;
    eprintln!(
        "scale: {} pods at once: {:?} to add, {:?} to delete",
        settings.at_once, at_once.add_wall, at_once.del_wall
    );
    drop(tb);

    let mut c =
        Cluster::with_plugin(&format!("{tag}c"), "10.230.0.0/16", ["10.230.0.0/20", "10.230.16.0/24"], plugin.clone())?;
    run_ids.extend(c.nodes.iter().map(|n| n.run_id.clone()));
    let churn = busy_churn::busy_churn(&mut c, &killer, settings.cycles, settings.batch)?;
    eprintln!("scale: {} churn cycles in {:?}", churn.cycles, churn.wall);
    drop(c);

    let mut tb = Testbed::with_plugin(&format!("{tag}n"), "10.231.0.0/20", plugin.clone())?;
    run_ids.push(tb.run_id.clone());
    let node = fill::fill_and_empty(&mut tb, &killer, settings.pods, settings.width)?;
    eprintln!("scale: {} pods on one node: {:?} to add, {:?} to delete", settings.pods, node.add_wall, node.del_wall);
    drop(tb);

    let namespaces_left = run_ids.iter().flat_map(|id| state::namespaces_left(id)).collect();
    Ok(ScaleFigures {
        settings: settings.clone(),
        seed,
        at_once,
        churn,
        node,
        kills: killer.tally(),
        namespaces_left,
        wall: started.elapsed(),
    })
}
