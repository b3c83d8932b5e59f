//! Scale and faults (issue 26), ebpf-cni only, not in the default run nor in `--smoke`: 64
//! pods added and deleted at once, 1,000 ADD/DEL cycles on a node with masqueraded traffic
//! and the agent running, 1,000 pods on one node each pinged from one of them (64 from the
//! node), one verb in 20 killed with SIGKILL at a random point, GC after each phase. The run is
//! the test's (`ebpf_cni_tests::scale`) at full size; the figures are counts, not timings to
//! compare, so they go to their own file rather than the paths table.
use std::path::Path;

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    Plugin,
    scale::{self, ScaleSettings},
};

/// Runs it (reduced with `smoke`), prints the figures and writes them to `<dir>/<date>-scale.md`
/// when given a `dir`; fails if there was a duplicate address, a leak or a verb that failed
/// without being killed.
pub fn run(ours: &Plugin, smoke: bool, dir: Option<&Path>, date: &str) -> Result<()> {
    let settings = if smoke { ScaleSettings::reduced() } else { ScaleSettings::full() };
    let load = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let figures = scale::run(&settings, ours, "bsc")?;
    let text = format!(
        "# ebpf-cni at scale, {date}\n\n{}\n\nLoad average {} when the run started; plugin {}. Wall times are \
         rough (a shared machine).\n\n{figures}",
        crate::provenance::line(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        ours.binary.display(),
    );
    println!("{text}");
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let file = dir.join(format!("{date}-scale.md"));
        std::fs::write(&file, &text)?;
        eprintln!("wrote {}", file.display());
    }
    let problems = figures.problems();
    ensure!(problems.is_empty(), "scale: {problems:?}");
    Ok(())
}
