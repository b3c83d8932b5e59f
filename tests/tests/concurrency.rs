//! Kubelet-scale concurrency: a node filling with pods at once (the first ADDs race to load the
//! programs), the same node emptied at once, and ADDs and DELs of different and of the same
//! pods overlapping.
use std::{collections::HashSet, net::Ipv4Addr};

use ebpf_cni_tests::{
    CniOutput, Testbed,
    scale::waves::{self, all_at_once},
    traffic::unreachable_pairs,
};

/// Pods started at once, as kubelet does when a node with many pending pods becomes ready.
/// `EBPF_CNI_PARALLEL_PODS` overrides it.
fn parallel_pods() -> usize {
    std::env::var("EBPF_CNI_PARALLEL_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

fn address(out: &CniOutput) -> Ipv4Addr {
    waves::address(out).unwrap_or_else(|| panic!("no address in {}", out.stdout))
}

#[test]
fn a_node_fills_and_empties_at_once() {
    let Some(mut tb) = Testbed::for_test("a_node_fills_and_empties_at_once", "fill", "10.228.0.0/24") else {
        return;
    };
    let pods: Vec<usize> = (0..parallel_pods()).map(|_| tb.new_pod().unwrap()).collect();
    let started = std::time::Instant::now();
    let outs = all_at_once(&tb, "ADD", &pods, &tb.conf("1.1.0")).unwrap();
    let elapsed = started.elapsed();
    for out in &outs {
        assert!(out.success, "a parallel ADD failed: {} {}", out.stdout, out.stderr);
    }
    let ips: Vec<Ipv4Addr> = outs.iter().map(address).collect();
    assert_eq!(ips.iter().collect::<HashSet<_>>().len(), pods.len(), "duplicate addresses: {ips:?}");
    // Every filter runs the same program: the racing first ADDs loaded it once.
    let filters = tb.from_pod_filter_programs().unwrap();
    assert_eq!(filters.len(), pods.len(), "from_pod filters");
    let ids: HashSet<u64> = filters.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids, HashSet::from([tb.program_id().unwrap()]), "programs loaded more than once");
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), pods.len());
    let reach: Vec<(String, Ipv4Addr)> = pods.iter().map(|p| tb.pods[*p].netns.name.clone()).zip(ips).collect();
    let missing = unreachable_pairs(&reach, 7777).unwrap();

    let pairs = pods.len() * (pods.len() - 1);
    assert!(
        missing.is_empty(),
        "{} of {pairs} pairs cannot reach each other, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(8)]
    );
    eprintln!(
        "{} parallel ADDs in {elapsed:?}; all {} pairs reach each other",
        pods.len(),
        pods.len() * (pods.len() - 1)
    );

    let started = std::time::Instant::now();
    for out in all_at_once(&tb, "DEL", &pods, &tb.conf("1.1.0")).unwrap() {
        assert!(out.success, "a parallel DEL failed: {} {}", out.stdout, out.stderr);
    }
    eprintln!("{} parallel DELs in {:?}", pods.len(), started.elapsed());
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn adds_and_dels_overlap_for_different_and_the_same_pods() {
    let Some(mut tb) =
        Testbed::for_test("adds_and_dels_overlap_for_different_and_the_same_pods", "overlap", "10.227.0.0/24")
    else {
        return;
    };
    let leaving: Vec<usize> = (0..8).map(|_| tb.new_pod().unwrap()).collect();
    let arriving: Vec<usize> = (0..8).map(|_| tb.new_pod().unwrap()).collect();
    let contested: Vec<usize> = (0..8).map(|_| tb.new_pod().unwrap()).collect();
    for pod in &leaving {
        tb.add(*pod).unwrap();
    }
    // The last of `leaving` to go would remove the network's pins while `arriving` need them;
    // each `contested` pod gets an ADD and a DEL at the same moment.
    let outs = std::thread::scope(|scope| {
        let tb = &tb;
        let mut calls = Vec::new();
        for pod in arriving.iter().chain(&contested) {
            calls.push((*pod, "ADD", scope.spawn(move || tb.cni("ADD", *pod, &tb.conf("1.1.0")).unwrap())));
        }
        for (n, pod) in leaving.iter().chain(&contested).enumerate() {
            calls.push((
                *pod,
                "DEL",
                scope.spawn(move || {
                    // Staggered, so that some DELs of contested pods come during their ADD and
                    // some before it.
                    std::thread::sleep(std::time::Duration::from_millis(n as u64 % 4 * 3));
                    tb.cni("DEL", *pod, &tb.conf("1.1.0")).unwrap()
                }),
            ));
        }
        calls.into_iter().map(|(pod, verb, call)| (pod, verb, call.join().unwrap())).collect::<Vec<_>>()
    });
    for (pod, verb, out) in &outs {
        assert!(out.success, "{verb} of pod {pod} failed: {} {}", out.stdout, out.stderr);
    }
    // Each contested pod is wholly there (its ADD ran last) or wholly gone (its DEL did).
    let veths = tb.host_veths().unwrap().len();
    let present: Vec<usize> = contested
        .iter()
        .copied()
        .filter(|pod| {
            let added = outs.iter().find(|(p, verb, _)| p == pod && *verb == "ADD").map(|(_, _, o)| o).unwrap();
            let mut conf = tb.conf("1.1.0");
            conf["prevResult"] = added.json();
            tb.cni("CHECK", *pod, &conf).unwrap().success
        })
        .collect();
    eprintln!("contested pods left standing (ADD ran last): {}", present.len());
    assert_eq!(veths, arriving.len() + present.len(), "veths");
    assert_eq!(tb.ip_files().len(), veths, "IP files");
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), veths, "endpoints");
    assert_eq!(tb.from_pod_filters().unwrap().len(), veths, "filters");
    let standing: Vec<(String, Ipv4Addr)> = arriving
        .iter()
        .chain(&present)
        .map(|pod| {
            let out = outs.iter().find(|(p, verb, _)| p == pod && *verb == "ADD").map(|(_, _, o)| o).unwrap();
            (tb.pods[*pod].netns.name.clone(), address(out))
        })
        .collect();
    assert_eq!(unreachable_pairs(&standing, 7777).unwrap(), vec![]);
    for pod in arriving.iter().chain(&contested) {
        tb.del(*pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
