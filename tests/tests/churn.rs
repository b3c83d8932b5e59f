//! Churn: pods come and go in batches, each with a masqueraded flow, next to one pod that stays
//! (so the network's maps stay pinned and can be counted). Nothing may pile up: veths, IP
//! files, endpoint and NAT entries, pins, descriptors at exit, and the plugin's peak memory.
use std::net::SocketAddrV4;

use ebpf_cni_tests::{
    Cluster, EXT_SERVER,
    scale::{
        churn::{ChurnPlan, churn},
        faults::Killer,
        rng::Rng,
        state::pins,
    },
};

/// ADD/DEL cycles: `EBPF_CNI_CHURN_CYCLES` (the full run is 1,000), 100 by default.
fn cycles() -> usize {
    std::env::var("EBPF_CNI_CHURN_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

const BATCH: usize = 10;

#[test]
fn churn_leaks_nothing() {
    let Some(mut c) =
        Cluster::for_test("churn_leaks_nothing", "churn", "10.226.0.0/16", ["10.226.1.0/24", "10.226.2.0/24"])
    else {
        return;
    };
    let tb = &mut c.nodes[0];
    let anchor = tb.new_pod().unwrap();
    let anchor_ip = tb.add(anchor).unwrap().parse().unwrap();
    let pins_before = pins(tb);
    let server = SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 9);
    let plan = ChurnPlan { cycles: cycles(), batch: BATCH, masq_to: Some(server), report_fds: true };
    let never = Killer::new(Rng::seeded(1), 0, tb).unwrap();
    let started = std::time::Instant::now();
    let outcome = churn(tb, &never, &plan, &[anchor_ip], |tb, done| {
        // One masqueraded flow per pod, so DEL has NAT entries to remove.
        anyhow::ensure!(tb.map_len("NAT")? >= 2 * BATCH, "cycle {done}: flows were not translated");
        Ok(())
    })
    .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(outcome.failures, Vec::<String>::new());
    assert_eq!(outcome.duplicates, 0, "duplicate addresses");
    // Medians of the first round's verbs and of the last round's.
    let (first, last) = (outcome.plugin_rss.first(BATCH).median, outcome.plugin_rss.last(BATCH).median);
    let peak = outcome.plugin_rss.first(outcome.cycles).max;
    let fds = &outcome.fds;
    eprintln!(
        "churn: {} ADD/DEL cycles in {elapsed:?}; plugin peak RSS median {first} KiB in the first round, {last} KiB \
         in the last, {peak} KiB at most; fds open at exit {}..={}",
        outcome.cycles,
        fds.iter().min().unwrap(),
        fds.iter().max().unwrap()
    );
    assert_eq!(fds.len(), 2 * outcome.cycles, "fd reports");
    assert_eq!(fds.iter().min(), fds.iter().max(), "descriptors left open at exit vary: {fds:?}");
    assert!(last <= first + first / 10, "peak RSS grew from {first} to {last} KiB");
    // Only the anchor is left, with exactly the pins it started with.
    assert_eq!(tb.host_veths().unwrap().len(), 1, "veths");
    assert_eq!(tb.ip_files().len(), 1, "IP files");
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), 1, "endpoints");
    // The deleted pods' flows are left to age (the programs ignore them: their owners are
    // gone); GC sweeps them, and counts what each pod holds again.
    tb.gc(&[anchor]).unwrap();
    assert_eq!(tb.map_len("NAT").unwrap(), 0, "NAT entries");
    assert_eq!(tb.map_len("NAT_SHARES").unwrap(), 0, "NAT_SHARES entries");
    assert_eq!(tb.from_pod_filters().unwrap().len(), 1, "filters");
    assert_eq!(pins(tb), pins_before, "pins");
    tb.del(anchor).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
