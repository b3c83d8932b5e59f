//! Scale and faults, reduced for CI (the full run is `cargo xtask bench -- --only scale`):
//! 64 pods added and deleted at once; 200 ADD/DEL cycles on a masquerading node with a pod
//! talking through the masquerade path and the agent running; 250 pods on one node, each
//! pinged; one verb in ten killed with SIGKILL at a random point; GC after each phase. No
//! address twice, nothing left, memory flat. See `ebpf_cni_tests::scale`.
use ebpf_cni_tests::{
    Plugin,
    scale::{self, ScaleSettings, memory::Summary},
};

/// Last cycles' median within 10 % (and 1 MiB, a page-rounding margin) of the first cycles'.
fn flat(first: Summary, last: Summary) -> bool {
    last.median <= first.median + (first.median / 10).max(1_024)
}

#[test]
fn pods_at_scale_with_kills_leave_nothing() {
    if !ebpf_cni_tests::require_privileges("pods_at_scale_with_kills_leave_nothing") {
        return;
    }
    let settings = ScaleSettings::reduced();
    let figures = scale::run(&settings, &Plugin::from_env().unwrap(), "scl").unwrap();
    eprintln!("{figures}");
    assert_eq!(figures.problems(), Vec::<String>::new());
    assert!(figures.kills.adds_killed > 0 && figures.kills.dels_killed > 0, "nothing was killed: {:?}", figures.kills);
    let (c, window) = (&figures.churn, scale::WINDOW);
    assert!(flat(c.plugin_rss.first(window), c.plugin_rss.last(window)), "the plugin's peak RSS grew");
    assert!(flat(c.agent_rss.first(window), c.agent_rss.last(window)), "the agent's RSS grew");
    // The resident pod's flow outlived every neighbour's ADD, DEL, kill and GC.
    assert!(c.traffic.answered * 100 >= c.traffic.asked * 99, "masqueraded traffic lost: {:?}", c.traffic);
}
