//! Churn: pods come and go in batches, each with a masqueraded flow, next to one pod that stays
//! (so the network's maps stay pinned and can be counted). Nothing may pile up: veths, IP
//! files, endpoint and NAT entries, pins, descriptors at exit, and the plugin's peak memory.
use std::net::{Ipv4Addr, SocketAddrV4};

use ebpf_cni_tests::{Cluster, CniOutput, EXT_SERVER, Testbed, traffic};

/// ADD/DEL cycles: `EBPF_CNI_CHURN_CYCLES` (the full run is 1,000), 100 by default.
fn cycles() -> usize {
    std::env::var("EBPF_CNI_CHURN_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

const BATCH: usize = 10;

/// Runs `command` for every pod in `pods` at once, asking for the fd count at exit.
fn batch(tb: &Testbed, command: &str, pods: &[usize]) -> Vec<CniOutput> {
    std::thread::scope(|scope| {
        let calls: Vec<_> = pods
            .iter()
            .map(|pod| {
                scope.spawn(move || {
                    let netns = tb.pods[*pod].netns_path();
                    let conf = tb.conf("1.1.0");
                    tb.cni_env(command, *pod, &conf, &netns, &[("EBPF_CNI_REPORT_FDS", "1")]).unwrap()
                })
            })
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    })
}

fn fds_at_exit(out: &CniOutput) -> usize {
    let line = out.stderr.lines().find_map(|l| l.strip_prefix("ebpf-cni: open fds at exit: "));
    line.and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no fd report in {:?}", out.stderr))
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

/// Every pin below the network's directory, as paths relative to it.
fn pins(tb: &Testbed) -> Vec<String> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, base, out);
            } else {
                out.push(path.strip_prefix(base).unwrap_or(&path).display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(&tb.pin_dir(), &tb.pin_dir(), &mut out);
    out.sort();
    out
}

#[test]
fn churn_leaks_nothing() {
    let Some(mut c) =
        Cluster::for_test("churn_leaks_nothing", "churn", "10.226.0.0/16", ["10.226.1.0/24", "10.226.2.0/24"])
    else {
        return;
    };
    let tb = &mut c.nodes[0];
    let anchor = tb.new_pod().unwrap();
    tb.add(anchor).unwrap();
    let pins_before = pins(tb);
    let slots: Vec<usize> = (0..BATCH).map(|_| tb.new_pod().unwrap()).collect();
    let server = SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 9);
    let (mut rss, mut fds, mut rss_first, mut rss_last) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let rounds = cycles().div_ceil(BATCH);
    let started = std::time::Instant::now();
    for round in 0..rounds {
        // New pods in the same sandboxes: a new container ID each round.
        for slot in &slots {
            tb.pods[*slot].container_id = format!("{}-c{slot}-r{round}", tb.run_id);
        }
        let added = batch(tb, "ADD", &slots);
        for (slot, out) in slots.iter().zip(&added) {
            assert!(out.success, "round {round}: ADD failed: {} {}", out.stdout, out.stderr);
            // One masqueraded flow per pod, so DEL has NAT entries to remove.
            let client = traffic::udp_socket(&tb.pods[*slot].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            client.unwrap().send_to(b"x", server).unwrap();
        }
        assert!(tb.map_len("NAT").unwrap() >= 2 * BATCH, "round {round}: flows were not translated");
        let deleted = batch(tb, "DEL", &slots);
        for out in &deleted {
            assert!(out.success, "round {round}: DEL failed: {} {}", out.stdout, out.stderr);
        }
        let calls: Vec<&CniOutput> = added.iter().chain(&deleted).collect();
        let round_rss: Vec<u64> = calls.iter().map(|o| o.peak_rss_kib).collect();
        if round == 0 {
            rss_first = round_rss.clone();
        }
        rss_last = round_rss.clone();
        rss.extend(round_rss);
        fds.extend(calls.iter().map(|o| fds_at_exit(o)));
    }
    let elapsed = started.elapsed();
    let (first, last, peak) = (median(rss_first), median(rss_last), rss.iter().copied().max().unwrap());
    eprintln!(
        "churn: {} ADD/DEL cycles in {elapsed:?}; plugin peak RSS median {first} KiB in the first round, {last} KiB \
         in the last, {peak} KiB at most; fds open at exit {}..={}",
        rounds * BATCH,
        fds.iter().min().unwrap(),
        fds.iter().max().unwrap()
    );
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
