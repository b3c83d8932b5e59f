//! Scale and faults, reduced for CI (the full run is `cargo xtask bench -- --only scale`):
//! 64 pods added and deleted at once; 200 ADD/DEL cycles on a masquerading node with a pod
//! talking through the masquerade path and the agent running; 250 pods on one node, each
//! pinged; one verb in ten killed with SIGKILL at a random point; GC after each phase. No
//! address twice, nothing left, memory flat. See `ebpf_cni_tests::scale`.
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

/// Neither side of a pod resolves the other: the pod's gateway and the node's route to the pod
/// have permanent neighbour entries, which the neighbour table's shared limit (gc_thresh3)
/// does not count. Resolved dynamically, a thousand pods pinged from the node would need
/// 2,000 entries of a table all namespaces share, 1,024 by default.
#[test]
fn neighbours_are_resolved_ahead() {
    let Some(mut tb) = Testbed::for_test("neighbours_are_resolved_ahead", "neigh", "10.232.0.0/24") else {
        return;
    };
    let pods: Vec<usize> = (0..4).map(|_| tb.new_pod().unwrap()).collect();
    let ips: Vec<String> = pods.iter().map(|pod| tb.add(*pod).unwrap()).collect();
    for ip in &ips {
        assert!(tb.ping(&tb.node.name, ip), "{ip} does not answer the node");
    }
    let entries = |netns: &str| {
        String::from_utf8_lossy(&run_in(netns, "ip", &["-4", "neigh", "show"]).unwrap().stdout).to_string()
    };
    let node = entries(&tb.node.name);
    for ip in &ips {
        let entry = node.lines().find(|l| l.starts_with(&format!("{ip} "))).unwrap_or_default();
        assert!(entry.trim_end().ends_with("PERMANENT"), "the node's entry for {ip}: {node}");
    }
    for pod in &pods {
        let entries = entries(&tb.pods[*pod].netns.name);
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
