//! An upgrade from the previous release (`EBPF_CNI_PREVIOUS_RELEASE_BIN`, cbce232, built by
//! `cargo xtask test` from git history), whose pinned layout is this build's own (v4): the new
//! binary finds pins the old one loaded and takes them as its own, so it must attach to them
//! and never load the programs again while pods use them. Pods of the old binary keep their
//! traffic meanwhile; this build's ADD, CHECK, DEL and GC handle old and new pods on that
//! datapath; once every pod is gone nothing is left. (`upgrade.rs` upgrades from the previous
//! layout's release, where the pins are another layout's.)
use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed, require_privileges,
    runtime::{Runtime, Sandbox},
    upgrade::{PINGS, UdpFlow, address, finish_pings, release_plugin, start_pings, start_tcp_conversation},
};
use serde_json::Value;

/// Owners of a pinned map's entries: `ENDPOINTS` values carry one, `POD_FLOWS` is keyed by it.
fn owners(tb: &Testbed, map: &str) -> BTreeSet<u64> {
    let dump = tb.map_dump_if_pinned(map).unwrap();
    let entries = dump.as_array().cloned().unwrap_or_default();
    let owner = |e: &Value| match map {
        "POD_FLOWS" => e["key"].as_u64(),
        _ => e["value"]["owner"].as_u64(),
    };
    entries.iter().map(|e| e.get("formatted").unwrap_or(e)).filter_map(owner).collect()
}

#[test]
fn pods_of_the_previous_release_keep_working_across_a_same_layout_upgrade() {
    let test = "pods_of_the_previous_release_keep_working_across_a_same_layout_upgrade";
    if !require_privileges(test) {
        return;
    }
    let Some(old) = release_plugin("EBPF_CNI_PREVIOUS_RELEASE_BIN", test) else { return };
    let new = ebpf_cni_tests::Plugin::from_env().unwrap();
    let mut c = Cluster::with_plugin("upgs", "10.203.0.0/16", ["10.203.1.0/24", "10.203.2.0/24"], old).unwrap();
    let ext = c.ext.name.clone();
    let tb = &mut c.nodes[0];
    let pods: Vec<usize> = (0..4).map(|_| tb.new_pod().unwrap()).collect();
    let (old_a, old_b, old_c, fresh) = (pods[0], pods[1], pods[2], pods[3]);
    let mut rt = Runtime::for_testbed(tb);
    let list = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    let sandboxes: Vec<Sandbox> = pods.iter().map(|&pod| tb.sandbox(pod)).collect();
    let ip_a = address(&rt.add(&list, &sandboxes[old_a]).unwrap());
    let ip_b = address(&rt.add(&list, &sandboxes[old_b]).unwrap());
    rt.add(&list, &sandboxes[old_c]).unwrap();
    // The old binary loaded this build's layout: the pins the new binary will take as its own.
    let loaded = tb.program_id().expect("the previous release loaded no v4 datapath");
    let ns = |pod: usize| tb.pods[pod].netns.name.clone();
    // A masqueraded flow of the pod whose DEL comes after the upgrade: its entries to clean.
    assert!(tb.ping(&ns(old_c), EXT_SERVER), "old pod → outside before the upgrade");

    // Traffic running across the upgrade: a masqueraded UDP flow, a long TCP connection, pings.
    let flow = UdpFlow::open(&ns(old_a), &ext).unwrap();
    let before = flow.exchange();
    assert_eq!(before.ip().to_string(), NODE1_UPLINK_IP);
    let stop = Arc::new(AtomicBool::new(false));
    let conversation = start_tcp_conversation(&ns(old_a), &ext, stop.clone()).unwrap();
    let pings = start_pings(&ns(old_b), EXT_SERVER).unwrap();
    let window = Instant::now();

    // The upgrade: this build's binary from now on, for every verb.
    tb.plugin = new.clone();
    rt.search_first(new.dir());
    let ip_fresh = address(&rt.add(&list, &sandboxes[fresh]).unwrap());
    assert_eq!(tb.program_id().unwrap(), loaded, "the new binary loaded the datapath again");
    let filters = tb.from_pod_filter_programs().unwrap();
    assert_eq!(filters.len(), 4, "a from_pod filter per pod: {filters:?}");
    assert!(filters.iter().all(|(_, id)| *id == loaded), "a pod runs another from_pod: {filters:?}");
    for pod in [old_a, old_b, old_c, fresh] {
        rt.check(&list, &sandboxes[pod]).unwrap_or_else(|e| panic!("CHECK of pod {pod} after the upgrade: {e:#}"));
    }
    let all: Vec<&Sandbox> = sandboxes.iter().collect();
    let gc = rt.gc(&list, &all).unwrap();
    assert!(gc.iter().all(|out| out.success), "GC with every pod valid: {gc:?}");
    assert_eq!(tb.host_veths().unwrap().len(), 4, "GC removed a valid pod");

    // DEL of an old pod by the new binary: its endpoint and its masquerade counter go.
    let (endpoints, pod_flows) = (owners(tb, "ENDPOINTS"), owners(tb, "POD_FLOWS"));
    rt.del(&list, &sandboxes[old_c]).unwrap();
    let gone: Vec<u64> = endpoints.difference(&owners(tb, "ENDPOINTS")).copied().collect();
    assert_eq!(gone.len(), 1, "DEL of one old pod removed the endpoints of {gone:?}");
    let left = owners(tb, "POD_FLOWS");
    assert!(!left.contains(&gone[0]), "DEL left the old pod's POD_FLOWS entry (before: {pod_flows:?})");
    assert_eq!(tb.host_veths().unwrap().len(), 3, "the old pod's DEL left its veth");
    assert_eq!(flow.exchange(), before, "the open flow changed its masquerade port");
    for (from, to, what) in [
        (ns(fresh), ip_a.as_str(), "new pod → old pod"),
        (ns(old_b), ip_fresh.as_str(), "old pod → new pod"),
        (ns(old_a), ip_b.as_str(), "old pod → old pod"),
        (ns(fresh), EXT_SERVER, "new pod → outside"),
    ] {
        assert!(tb.ping(&from, to), "{what}");
    }
    let upgrade_took = window.elapsed();

    let (sent, answered) = finish_pings(pings).unwrap();
    stop.store(true, Ordering::Relaxed);
    let (exchanges, retransmits) = conversation.join().unwrap().unwrap();
    eprintln!(
        "same-layout upgrade steps {upgrade_took:.1?}; pings {answered}/{sent}; TCP {exchanges} exchanges, \
         {retransmits} retransmitted; the old pod's POD_FLOWS entry {}",
        if pod_flows.contains(&gone[0]) { "removed" } else { "absent before its DEL" }
    );
    assert!(upgrade_took < Duration::from_millis(50 * u64::from(PINGS)), "the pings ended before the upgrade did");
    assert_eq!((sent, answered), (PINGS, PINGS), "pings lost while the plugin was upgraded");
    assert!(exchanges > 0, "the long TCP connection exchanged nothing");
    assert_eq!(retransmits, 0, "the long TCP connection lost segments while the plugin was upgraded");

    // Every pod goes: two by DEL, one vanishes without one (its sandbox gone); GC then finds
    // nothing valid and removes the last attachment and the datapath the old binary loaded.
    rt.del(&list, &sandboxes[old_a]).unwrap();
    rt.del(&list, &sandboxes[fresh]).unwrap();
    ebpf_cni_tests::run("ip", &["netns", "del", &ns(old_b)]).unwrap();
    assert_eq!(tb.program_id().unwrap(), loaded, "the vanished pod still holds the datapath");
    let gc = rt.gc(&list, &[]).unwrap();
    assert!(gc.iter().all(|out| out.success), "GC with no pod valid: {gc:?}");
    assert!(!tb.pin_dir().exists(), "GC left the network's pins");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
