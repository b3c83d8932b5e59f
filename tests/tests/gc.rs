//! GC (spec 1.1): after ADDs and DELs killed with SIGKILL at every step, and after pods that
//! vanished without a DEL, one GC with the valid attachments leaves exactly those, working.
use ebpf_cni_tests::{
    Testbed,
    crash::{ADD_STEPS, DEL_STEPS, killed_at},
    runtime::{NetworkList, Runtime, Sandbox},
};
use serde_json::json;

/// Exactly the valid pods' pieces are left, and they still reach each other.
fn only_valid_left(tb: &Testbed, valid: &[usize], ips: &[String], when: &str) {
    assert_eq!(tb.host_veths().unwrap().len(), valid.len(), "{when}: veths");
    assert_eq!(tb.ip_files().len(), valid.len(), "{when}: IP files");
    assert_eq!(tb.from_pod_filters().unwrap().len(), valid.len(), "{when}: from_pod filters");
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), valid.len(), "{when}: endpoints");
    assert!(tb.ping(&tb.pods[valid[0]].netns.name, &ips[1]), "{when}: valid pods lost connectivity");
}

fn gc(rt: &Runtime, list: &NetworkList, valid: &[&Sandbox]) {
    let outs = rt.gc(list, valid).unwrap();
    assert_eq!(outs.len(), 1, "GC did not run");
    eprintln!("{}", outs[0].stderr.trim());
}

#[test]
fn gc_cleans_up_after_killed_adds_and_dels() {
    let Some(mut tb) = Testbed::for_test("gc_cleans_up_after_killed_adds_and_dels", "gc", "10.240.0.0/24") else {
        return;
    };
    let rt = Runtime::for_testbed(&tb);
    let list = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    let valid: Vec<usize> = (0..2).map(|_| tb.new_pod().unwrap()).collect();
    let ips: Vec<String> = valid.iter().map(|p| tb.add(*p).unwrap()).collect();
    let sandboxes: Vec<Sandbox> = valid.iter().map(|p| tb.sandbox(*p)).collect();
    let keep: Vec<&Sandbox> = sandboxes.iter().collect();
    // `add:mid-load` is only reached by a network's first ADD: the next test covers it.
    for step in ADD_STEPS.into_iter().filter(|s| *s != "add:mid-load") {
        let pod = tb.new_pod().unwrap();
        killed_at(&tb, pod, "ADD", step);
        gc(&rt, &list, &keep);
        only_valid_left(&tb, &valid, &ips, step);
        let links = ebpf_cni_tests::run_in(&tb.pods[pod].netns.name, "ip", &["-o", "link"]).unwrap();
        assert!(!String::from_utf8_lossy(&links.stdout).contains("eth0"), "{step}: the pod end survived");
    }
    for step in DEL_STEPS {
        let pod = tb.new_pod().unwrap();
        tb.add(pod).unwrap();
        killed_at(&tb, pod, "DEL", step);
        gc(&rt, &list, &keep);
        only_valid_left(&tb, &valid, &ips, step);
    }
    // No valid attachment left: the network's programs and maps go too.
    gc(&rt, &list, &[]);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn gc_after_a_killed_first_load_and_vanished_pods() {
    let Some(mut tb) = Testbed::for_test("gc_after_a_killed_first_load_and_vanished_pods", "gcload", "10.239.0.0/24")
    else {
        return;
    };
    let rt = Runtime::for_testbed(&tb);
    let list = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    let pod = tb.new_pod().unwrap();
    killed_at(&tb, pod, "ADD", "add:mid-load");
    gc(&rt, &list, &[]);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // The next ADD loads from scratch and works.
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    tb.add(a).unwrap();
    let ip_b = tb.add(b).unwrap();
    assert!(tb.ping(&tb.pods[a].netns.name, &ip_b));
    // Pod b's sandbox vanishes without a DEL; the older `cni.dev/attachments` key names a.
    ebpf_cni_tests::run("ip", &["netns", "del", &tb.pods[b].netns.name]).unwrap();
    let sb_a = tb.sandbox(a);
    let attachments = json!([{ "containerID": sb_a.container_id, "ifname": "eth0" }]);
    let out = rt.invoke(&list, &list.plugins[0], "GC", None, &[("cni.dev/attachments", attachments)]).unwrap();
    assert!(out.success, "{}", out.stdout);
    assert_eq!(tb.ip_files().len(), 1);
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), 1);
    assert_eq!(tb.from_pod_filters().unwrap(), tb.host_veths().unwrap());
    assert_eq!(tb.host_veths().unwrap().len(), 1);
    tb.del(a).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn gc_touches_only_its_own_network() {
    let Some(mut tb) = Testbed::for_test("gc_touches_only_its_own_network", "gcnet", "10.238.0.0/24") else {
        return;
    };
    let rt = Runtime::for_testbed(&tb);
    let list_a = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    // A second network on the same node, its own subnet, pins and data.
    let mut conflist_b = tb.conflist("1.1.0", vec![]);
    conflist_b["name"] = json!("other-net");
    conflist_b["plugins"][0]["ipam"]["subnet"] = json!("10.237.0.0/24");
    let list_b = rt.load(&conflist_b).unwrap();
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let (sb_a, mut sb_b) = (tb.sandbox(a), tb.sandbox(b));
    sb_b.ifname = "net1".into();
    rt.add(&list_a, &sb_a).unwrap();
    rt.add(&list_b, &sb_b).unwrap();
    gc(&rt, &list_a, &[]);
    assert_eq!(tb.host_veths().unwrap().len(), 1, "GC of one network removed another's veth");
    assert!(tb.bpffs_root().join("other-net").exists(), "GC of one network removed another's pins");
    rt.check(&list_b, &sb_b).unwrap();
    rt.del(&list_b, &sb_b).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    assert!(!tb.bpffs_root().join("other-net").exists());
}
