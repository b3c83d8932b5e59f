//! An upgrade while pods run (design.md, "Upgrades"): a node whose pods the previous layout's
//! release (`EBPF_CNI_BASE_BIN`, 52899e9, v3, built by `cargo xtask test` from git history)
//! added gets this build (`upgrade_same_layout.rs` upgrades from the previous release, v4).
//! Its pods keep their traffic while it happens (a ping every 50 ms to the outside loses
//! nothing, a long TCP connection and a masqueraded UDP flow keep going); this build's ADD,
//! CHECK, GC and DEL handle the old pods and new ones beside them on the datapath already
//! loaded (one with bandwidth limits, which that datapath enforces); once the old layout's pods
//! are gone, GC removes its pins, the next ADD loads this build's layout, and nothing is left
//! behind.
use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER, NODE1_UPLINK_IP, Plugin, Testbed, crash, require_privileges, run_in,
    runtime::{Runtime, Sandbox},
    upgrade::{PINGS, UdpFlow, address, finish_pings, release_plugin, start_pings, start_tcp_conversation},
};
use serde_json::{Value, json};

/// The pin directory of the base release's layout (`EBPF_CNI_BASE_BIN`, 52899e9: v3).
const PREVIOUS_LAYOUT: &str = "v3";

/// The previous layout's release, or `None` (then the test is skipped, except under CI).
fn base_plugin(test: &str) -> Option<Plugin> {
    release_plugin("EBPF_CNI_BASE_BIN", test)
}

#[test]
fn pods_of_the_previous_release_keep_working_across_an_upgrade() {
    let test = "pods_of_the_previous_release_keep_working_across_an_upgrade";
    if !require_privileges(test) {
        return;
    }
    let Some(base) = base_plugin(test) else { return };
    let new = Plugin::from_env().unwrap();
    let mut c = Cluster::with_plugin("upg", "10.251.0.0/16", ["10.251.1.0/24", "10.251.2.0/24"], base).unwrap();
    let ext = c.ext.name.clone();
    let tb = &mut c.nodes[0];
    let (old_a, old_b, old_c, fresh) =
        (tb.new_pod().unwrap(), tb.new_pod().unwrap(), tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let limited = tb.new_pod().unwrap();
    let mut rt = Runtime::for_testbed(tb);
    let list = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    let sandboxes: Vec<Sandbox> = (0..4).map(|pod| tb.sandbox(pod)).collect();
    let ip_a = address(&rt.add(&list, &sandboxes[old_a]).unwrap());
    let ip_b = address(&rt.add(&list, &sandboxes[old_b]).unwrap());
    rt.add(&list, &sandboxes[old_c]).unwrap();
    assert!(tb.pin_dir().join(PREVIOUS_LAYOUT).join("progs/from_pod").exists(), "the previous release's layout");
    let ns = |pod: usize| tb.pods[pod].netns.name.clone();

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
    assert!(!tb.version_dir().exists(), "a second datapath loaded beside the running one");
    for pod in [old_a, old_b, old_c, fresh] {
        rt.check(&list, &sandboxes[pod]).unwrap_or_else(|e| panic!("CHECK of pod {pod} after the upgrade: {e:#}"));
    }
    let all: Vec<&Sandbox> = sandboxes.iter().collect();
    let gc = rt.gc(&list, &all).unwrap();
    assert!(gc.iter().all(|out| out.success), "GC with every pod valid: {gc:?}");
    assert_eq!(tb.host_veths().unwrap().len(), 4, "GC removed a valid pod");
    rt.del(&list, &sandboxes[old_c]).unwrap();
    assert_eq!(flow.exchange(), before, "the open flow changed its masquerade port");
    for (from, to, what) in [
        (ns(fresh), ip_a.as_str(), "new pod → old pod"),
        (ns(old_b), ip_fresh.as_str(), "old pod → new pod"),
        (ns(old_a), ip_b.as_str(), "old pod → old pod"),
        (ns(fresh), EXT_SERVER, "new pod → outside"),
    ] {
        assert!(tb.ping(&from, to), "{what}");
    }
    let settings = Command::new(&tb.plugin.binary)
        .args(["inspect", "settings", "-o", "json", "--bpffs-root"])
        .arg(tb.bpffs_root())
        .args(["--netns", &format!("/run/netns/{}", tb.node.name)])
        .output()
        .unwrap();
    assert!(settings.status.success(), "inspect reads the previous layout's pins: {settings:?}");
    let upgrade_took = window.elapsed();

    // Limits on the previous layout's datapath: its programs shape both ways (`FEATURES` has
    // the egress-shaping bit), reading the flags this build's ADD writes into its `ENDPOINTS`.
    // A ping to the new pod (a fast path but for the flags) goes through the limited pod's IFB
    // out and through its host veth's TBF in.
    let mut shaped = tb.conflist("1.1.0", vec![]);
    shaped["plugins"][0]["capabilities"] = json!({ "bandwidth": true });
    let shaped = rt.load(&shaped).unwrap();
    let mut limited_sandbox = tb.sandbox(limited);
    let (rate, burst) = (20_000_000u64, 400_000u64);
    let limits = json!({ "ingressRate": rate, "ingressBurst": burst, "egressRate": rate, "egressBurst": burst });
    limited_sandbox.capability_args.insert("bandwidth".into(), limits);
    rt.add(&shaped, &limited_sandbox).unwrap();
    rt.check(&shaped, &limited_sandbox).unwrap();
    let ifb = tb.ifbs().unwrap().pop().expect("the limited pod has no IFB");
    let veth = ifb.replacen("ecnb", "ecni", 1);
    assert!(tb.ping(&ns(limited), &ip_fresh), "limited pod → new pod");
    assert!(root_qdisc_packets(tb, &ifb) > 0, "the egress limit was skipped on the previous datapath");
    assert!(root_qdisc_packets(tb, &veth) > 0, "the ingress limit was skipped on the previous datapath");
    rt.del(&shaped, &limited_sandbox).unwrap();
    assert_eq!(tb.host_veths().unwrap().len(), 3, "the limited pod's DEL left its veth");
    assert_eq!(tb.ifbs().unwrap(), Vec::<String>::new(), "the limited pod's DEL left its IFB");

    let (sent, answered) = finish_pings(pings).unwrap();
    stop.store(true, Ordering::Relaxed);
    let (exchanges, retransmits) = conversation.join().unwrap().unwrap();
    eprintln!(
        "upgrade steps {upgrade_took:.1?}; pings {answered}/{sent}; TCP {exchanges} exchanges, {retransmits} retransmitted"
    );
    assert!(upgrade_took < Duration::from_millis(50 * u64::from(PINGS)), "the pings ended before the upgrade did");
    assert_eq!((sent, answered), (PINGS, PINGS), "pings lost while the plugin was upgraded");
    assert!(exchanges > 0, "the long TCP connection exchanged nothing");
    assert_eq!(retransmits, 0, "the long TCP connection lost segments while the plugin was upgraded");

    // The old pods go: one by DEL, one vanishes without it (its sandbox gone); the new pod's DEL.
    rt.del(&list, &sandboxes[old_a]).unwrap();
    rt.del(&list, &sandboxes[fresh]).unwrap();
    ebpf_cni_tests::run("ip", &["netns", "del", &ns(old_b)]).unwrap();
    assert!(tb.pin_dir().join(PREVIOUS_LAYOUT).exists(), "the vanished pod still holds the previous layout");
    // GC with nothing valid: the last attachment of the old layout and then its pins go.
    let gc = rt.gc(&list, &[]).unwrap();
    assert!(gc.iter().all(|out| out.success), "GC with no pod valid: {gc:?}");
    assert!(!tb.pin_dir().join(PREVIOUS_LAYOUT).exists(), "GC left the pins of a layout no pod uses");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());

    // The network's next ADD loads this build's layout.
    let next = tb.new_pod().unwrap();
    tb.add(next).unwrap();
    assert!(tb.version_dir().join("progs/from_pod").exists(), "this build's layout was not loaded");
    let next_ns = tb.pods[next].netns.name.clone();
    assert!(tb.ping(&next_ns, EXT_SERVER), "a pod on this build's datapath → outside");
    tb.del(next).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// This build's filters on node 1's uplink, (egress, ingress).
fn uplink_filters(tb: &Testbed) -> (usize, usize) {
    let count = |direction: &str| {
        let out = run_in(&tb.node.name, "tc", &["filter", "show", "dev", "uplink0", direction]).unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("direct-action")).count()
    };
    (count("egress"), count("ingress"))
}

/// Packets the root qdisc of `dev` in node 1 has sent (a limit's TBF).
fn root_qdisc_packets(tb: &Testbed, dev: &str) -> u64 {
    let out = run_in(&tb.node.name, "tc", &["-s", "-j", "qdisc", "show", "dev", dev, "root"]).unwrap();
    let qdiscs: Value = serde_json::from_slice(&out.stdout).unwrap();
    qdiscs[0]["packets"].as_u64().unwrap_or_else(|| panic!("no packet count for {dev}: {qdiscs}"))
}

/// The previous release's uplink programs: their ids, from their pins in its layout's directory.
fn previous_uplink_programs(tb: &Testbed) -> Vec<u64> {
    ["to_uplink", "from_uplink"]
        .iter()
        .map(|name| {
            let pin = tb.pin_dir().join(PREVIOUS_LAYOUT).join("progs").join(name);
            let out = ebpf_cni_tests::run("bpftool", &["-j", "prog", "show", "pinned", pin.to_str().unwrap()]).unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"].as_u64().unwrap()
        })
        .collect()
}

/// How many of node 1's uplink filters run one of `programs` (ids are unique node-wide).
fn filters_running(tb: &Testbed, programs: &[u64]) -> usize {
    let out = run_in(&tb.node.name, "bpftool", &["-j", "net", "show"]).unwrap();
    let net: Value = serde_json::from_slice(&out.stdout).unwrap();
    let filters = net[0]["tc"].as_array().cloned().unwrap_or_default();
    filters
        .iter()
        .filter(|f| f["devname"] == "uplink0" && f["id"].as_u64().is_some_and(|id| programs.contains(&id)))
        .count()
}

/// The last DEL of a network that still runs the previous release's datapath (its layout, with
/// masquerade), killed midway: after it unpinned `from_pod`, the mark of a complete load, and
/// before it removed the uplink's filters running that layout's programs and the rest of its
/// directory (`del:mid-unload`).
/// That directory used to lock the network out for good: every ADD was refused with code 102
/// ("holds pins of another ebpf-cni layout"), and neither the runtime's DEL retry nor GC removed
/// it, as they only looked at this build's layout. Now whichever verb comes next (a new pod's
/// ADD, the DEL's retry, a GC) finishes the removal, the previous layout's uplink filters
/// included; the ADD then loads this build's datapath and its pod reaches the outside.
#[test]
fn an_interrupted_last_del_of_the_previous_layout_does_not_lock_the_network_out() {
    let test = "an_interrupted_last_del_of_the_previous_layout_does_not_lock_the_network_out";
    if !require_privileges(test) {
        return;
    }
    let Some(base) = base_plugin(test) else { return };
    let new = Plugin::from_env().unwrap();
    let mut c =
        Cluster::with_plugin("upgi", "10.250.0.0/16", ["10.250.1.0/24", "10.250.2.0/24"], base.clone()).unwrap();
    let tb = &mut c.nodes[0];
    for next in ["ADD", "DEL", "GC"] {
        tb.plugin = base.clone();
        let old = tb.new_pod().unwrap();
        tb.add(old).unwrap();
        let old_dir = tb.pin_dir().join(PREVIOUS_LAYOUT);
        assert!(old_dir.join("progs/from_pod").exists(), "{next}: the previous release's layout");
        let previous = previous_uplink_programs(tb);
        assert_eq!(filters_running(tb, &previous), 2, "{next}: the previous release's uplink filters");
        tb.plugin = new.clone();
        crash::killed_at(tb, old, "DEL", crash::LAST_DEL_STEP);
        assert!(
            old_dir.exists() && !old_dir.join("progs/from_pod").exists(),
            "{next}: the DEL was not interrupted midway"
        );
        assert_eq!(filters_running(tb, &previous), 2, "{next}: the previous layout's uplink filters were already gone");
        match next {
            "ADD" => {
                let pod = tb.new_pod().unwrap();
                let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
                assert!(out.success, "ADD after the interrupted DEL: {} {}", out.stdout, out.stderr);
                assert!(!old_dir.exists(), "ADD left the previous layout's pins");
                assert!(tb.version_dir().join("progs/from_pod").exists(), "this build's layout was not loaded");
                assert_eq!(uplink_filters(tb), (1, 1), "one filter each way: this build's");
                assert!(tb.ping(&tb.pods[pod].netns.name, EXT_SERVER), "the new pod → outside");
                tb.del(old).unwrap();
                tb.del(pod).unwrap();
            }
            "DEL" => tb.del(old).unwrap(),
            _ => {
                let mut conf = tb.conf("1.1.0");
                conf["cni.dev/valid-attachments"] = json!([]);
                let out = tb.cni("GC", old, &conf).unwrap();
                assert!(out.success, "GC: {} {}", out.stdout, out.stderr);
            }
        }
        assert!(!old_dir.exists(), "{next} left the previous layout's pins");
        assert_eq!(filters_running(tb, &previous), 0, "{next}: the previous layout's uplink filters stay");
        assert_eq!(uplink_filters(tb), (0, 0), "{next}: filters left on the uplink");
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{next}");
    }
}
