//! ADD/DEL lifecycle: DEL leaves nothing and is idempotent; a failed ADD rolls back everything.
use ebpf_cni_tests::{
    Testbed,
    crash::{ADD_STEPS, DEL_STEPS, killed_at},
    run,
};

#[test]
fn del_leaves_nothing_and_is_idempotent() {
    let Some(mut tb) = Testbed::for_test("del_leaves_nothing_and_is_idempotent", "del", "10.252.0.0/24") else {
        return;
    };
    for _ in 0..3 {
        let pod = tb.new_pod().unwrap();
        tb.add(pod).unwrap();
    }
    assert_eq!(tb.host_veths().unwrap().len(), 3);
    assert_eq!(tb.ip_files().len(), 3);
    // Kubelet's DEL (netns given), then containerd's (empty CNI_NETNS), each twice.
    for pod in 0..3 {
        tb.del(pod).unwrap();
        tb.del(pod).unwrap();
        tb.del_without_netns(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // A container this node never saw.
    let conf = tb.conf("1.0.0").to_string();
    let out = tb
        .cni_raw(
            &[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", "never-seen"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            &conf,
        )
        .unwrap();
    assert!(out.success, "DEL of an unknown container failed: {}", out.stdout);
    assert!(out.stdout.trim().is_empty(), "DEL printed on stdout: {}", out.stdout);
}

#[test]
fn del_after_netns_is_gone() {
    let Some(mut tb) = Testbed::for_test("del_after_netns_is_gone", "gone", "10.253.0.0/24") else { return };
    let pod = tb.new_pod().unwrap();
    tb.add(pod).unwrap();
    run("ip", &["netns", "del", &tb.pods[pod].netns.name]).unwrap();
    tb.del_without_netns(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn add_twice_fails_and_keeps_the_first() {
    let Some(mut tb) = Testbed::for_test("add_twice_fails_and_keeps_the_first", "twice", "10.254.0.0/24") else {
        return;
    };
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let ip_a = tb.add(a).unwrap();
    tb.add(b).unwrap();
    let again = tb.cni("ADD", a, &tb.conf("1.0.0")).unwrap();
    assert_eq!(again.code(), Some(101), "second ADD: {}", again.stdout);
    assert!(again.json()["msg"].as_str().unwrap().contains("already exists"));
    assert_eq!(tb.ip_files().len(), 2, "the failed ADD must not reserve or release addresses");
    assert!(tb.ping(&tb.pods[b].netns.name, &ip_a), "the first attachment was damaged");
}

#[test]
fn exhausted_pool_rolls_back() {
    // A /30 has exactly one address to give: .1 is the gateway.
    let Some(mut tb) = Testbed::for_test("exhausted_pool_rolls_back", "pool", "10.249.0.0/30") else { return };
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    tb.add(a).unwrap();
    let out = tb.cni("ADD", b, &tb.conf("1.0.0")).unwrap();
    assert_eq!(out.code(), Some(100), "{}", out.stdout);
    assert_eq!(tb.host_veths().unwrap().len(), 1, "the failed ADD left a veth");
    assert_eq!(tb.ip_files().len(), 1);
    let links = run("ip", &["-n", &tb.pods[b].netns.name, "-o", "link"]).unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains("eth0"), "the failed ADD left eth0 in the pod");
}

#[test]
fn failure_after_the_veth_rolls_back_everything() {
    let Some(mut tb) = Testbed::for_test("failure_after_the_veth_rolls_back_everything", "rollback", "10.248.0.0/24")
    else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    // Pins under a file, where bpffs cannot be mounted: ADD fails at the datapath step, after
    // IPAM, the veth pair, addresses and routes are already done.
    std::fs::create_dir_all(tb.data_dir()).unwrap();
    let file = tb.data_dir().join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut conf = tb.conf("1.0.0");
    conf["bpffsRoot"] = serde_json::json!(file.join("ebpf-cni"));
    let out = tb.cni("ADD", pod, &conf).unwrap();
    assert_eq!(out.code(), Some(102), "{} {}", out.stdout, out.stderr);
    assert!(out.json()["msg"].as_str().unwrap().contains("cannot be mounted"), "{}", out.stdout);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // The runtime sends DEL after a failed ADD: it must succeed too.
    let del = tb.cni("DEL", pod, &conf).unwrap();
    assert!(del.success, "{}", del.stdout);
}

/// An ADD killed at any step, then the runtime's DEL (as containerd and CRI-O send after a
/// failed ADD): the node is as clean as before, and the next ADD of the same pod works.
#[test]
fn del_cleans_up_after_a_kill_at_every_step() {
    let Some(mut tb) = Testbed::for_test("del_cleans_up_after_a_kill_at_every_step", "killdel", "10.222.0.0/24") else {
        return;
    };
    for step in ADD_STEPS {
        let pod = tb.new_pod().unwrap();
        killed_at(&tb, pod, "ADD", step);
        tb.del(pod).unwrap();
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "after ADD killed at {step}, then DEL");
        let links = run("ip", &["-n", &tb.pods[pod].netns.name, "-o", "link"]).unwrap();
        assert!(!String::from_utf8_lossy(&links.stdout).contains("eth0"), "{step}: the pod end survived");
        tb.add(pod).unwrap();
        tb.del(pod).unwrap();
    }
    // A DEL killed at any step, then DEL again (the runtime retries until it succeeds).
    let anchor = tb.new_pod().unwrap();
    let ip = tb.add(anchor).unwrap();
    for step in DEL_STEPS {
        let pod = tb.new_pod().unwrap();
        tb.add(pod).unwrap();
        killed_at(&tb, pod, "DEL", step);
        tb.del(pod).unwrap();
        assert_eq!(tb.host_veths().unwrap().len(), 1, "{step}: veths");
        assert_eq!(tb.ip_files(), vec![ip.clone()], "{step}: IP files");
        assert_eq!(tb.map_len("ENDPOINTS").unwrap(), 1, "{step}: endpoints");
    }
    tb.del(anchor).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
