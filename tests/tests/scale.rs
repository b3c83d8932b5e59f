//! Scale and faults, reduced for CI (the full run is `cargo xtask bench -- --only scale`):
//! 64 pods added and deleted at once; 200 ADD/DEL cycles on a masquerading node with a pod
//! talking through the masquerade path and the agent running; 250 pods on one node, each
//! pinged from one of them (and 64 from the node); one verb in ten killed with SIGKILL at a
//! random point; GC after each phase. No address twice, nothing left, memory flat. See
//! `ebpf_cni_tests::scale`.
use ebpf_cni_tests::{
    Plugin, Testbed, run_in,
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
    let mut settings = ScaleSettings::reduced();
    // Bigger by hand: `EBPF_CNI_SCALE_CYCLES`, `EBPF_CNI_SCALE_PODS`.
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    settings.cycles = var("EBPF_CNI_SCALE_CYCLES").unwrap_or(settings.cycles);
    settings.pods = var("EBPF_CNI_SCALE_PODS").unwrap_or(settings.pods);
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

/// A pod never resolves its gateway: ADD gives it a permanent neighbour entry, which the
/// neighbour table's shared limit (gc_thresh3, 1,024 by default, for all namespaces together)
/// does not count. Resolved, a thousand pods each talking would fill that table by themselves.
#[test]
fn pods_never_resolve_their_gateway() {
    let Some(mut tb) = Testbed::for_test("pods_never_resolve_their_gateway", "neigh", "10.232.0.0/24") else {
        return;
    };
    let pods: Vec<usize> = (0..4).map(|_| tb.new_pod().unwrap()).collect();
    let ips: Vec<String> = pods.iter().map(|pod| tb.add(*pod).unwrap()).collect();
    let first = tb.pods[pods[0]].netns.name.clone();
    for ip in &ips {
        assert!(tb.ping(&first, ip), "{ip} does not answer pod 0");
    }
    // (The node's own pings would leave entries for the node's address: a pod learns the
    // sender of each ARP request it answers.)
    for pod in &pods {
        let out = run_in(&tb.pods[*pod].netns.name, "ip", &["-4", "neigh", "show"]).unwrap();
        let entries = String::from_utf8_lossy(&out.stdout);
        assert!(
            entries.lines().all(|l| l.trim_end().ends_with("PERMANENT")) && entries.contains("10.232.0.1 "),
            "pod {pod}: {entries}"
        );
    }
    for pod in pods {
        tb.del(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
