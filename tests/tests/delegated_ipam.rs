//! An `ipam.type` other than ours is executed from CNI_PATH (here the reference `static` plugin):
//! its addresses are used for ADD, DEL is forwarded, and its errors come back with their code.
use ebpf_cni_tests::Testbed;
use serde_json::{Value, json};

fn static_conf(tb: &Testbed, address: &str) -> Value {
    let mut conf = tb.conf("1.0.0");
    conf["ipam"] = json!({
        "type": "static",
        "addresses": [{ "address": address, "gateway": "10.243.0.1" }],
    });
    conf
}

#[test]
fn static_ipam_plugin_is_executed_from_cni_path() {
    let Some(mut tb) = Testbed::for_test("static_ipam_plugin_is_executed_from_cni_path", "deleg", "10.243.0.0/24")
    else {
        return;
    };
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    for (pod, address) in [(a, "10.243.0.10/24"), (b, "10.243.0.11/24")] {
        let out = tb.cni("ADD", pod, &static_conf(&tb, address)).unwrap();
        assert!(out.success, "{} {}", out.stdout, out.stderr);
        assert_eq!(out.json()["ips"][0]["address"], address);
        assert_eq!(out.json()["ips"][0]["gateway"], "10.243.0.1");
    }
    assert!(tb.ping(&tb.pods[a].netns.name, "10.243.0.11"), "pods with delegated addresses cannot talk");
    for (pod, address) in [(a, "10.243.0.10/24"), (b, "10.243.0.11/24")] {
        let out = tb.cni("DEL", pod, &static_conf(&tb, address)).unwrap();
        assert!(out.success, "{}", out.stdout);
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn missing_or_failing_ipam_plugin_leaves_nothing() {
    let Some(mut tb) = Testbed::for_test("missing_or_failing_ipam_plugin_leaves_nothing", "delegerr", "10.242.0.0/24")
    else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    let mut missing = tb.conf("1.0.0");
    missing["ipam"] = json!({ "type": "no-such-ipam-plugin" });
    let out = tb.cni("ADD", pod, &missing).unwrap();
    assert_eq!(out.code(), Some(7), "{}", out.stdout);
    // `static` refuses a malformed address itself; its code and message must reach the runtime.
    let out = tb.cni("ADD", pod, &static_conf(&tb, "banana")).unwrap();
    assert_eq!(out.code(), Some(999), "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().starts_with("static:"), "{}", out.stdout);
    // An IPAM plugin that succeeds without an address cannot give the pod one.
    let mut empty = tb.conf("1.0.0");
    empty["ipam"] = json!({ "type": "static" });
    let out = tb.cni("ADD", pod, &empty).unwrap();
    assert_eq!(out.code(), Some(7), "{}", out.stdout);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// An IPAM plugin that speaks spec 1.1.0 (none of Debian's does): it logs each verb it gets,
/// hands out one address, and fails STATUS while a `full` file exists.
const FAKE_IPAM: &str = r#"#!/bin/sh
dir=$(dirname "$0")
cat > /dev/null
echo "$CNI_COMMAND" >> "$dir/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}' ;;
ADD) echo '{"cniVersion":"1.1.0","ips":[{"address":"10.231.0.9/24","gateway":"10.231.0.1"}]}' ;;
STATUS) if [ -e "$dir/full" ]; then echo '{"cniVersion":"1.1.0","code":50,"msg":"fake: no addresses left"}'; exit 1; fi ;;
esac
"#;

#[test]
fn check_gc_and_status_reach_a_delegated_plugin() {
    use std::os::unix::fs::PermissionsExt as _;

    use ebpf_cni_tests::runtime::Runtime;
    let Some(mut tb) = Testbed::for_test("check_gc_and_status_reach_a_delegated_plugin", "deleg11", "10.231.0.0/24")
    else {
        return;
    };
    let dir = tb.data_dir().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("fake-ipam");
    std::fs::write(&script, FAKE_IPAM).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut rt = Runtime::for_testbed(&tb);
    rt.search_first(dir.clone());
    let mut conflist = tb.conflist("1.1.0", vec![]);
    conflist["plugins"][0]["ipam"] = json!({ "type": "fake-ipam" });
    let list = rt.load(&conflist).unwrap();
    let pod = tb.new_pod().unwrap();
    let sb = tb.sandbox(pod);
    assert_eq!(rt.add(&list, &sb).unwrap()["ips"][0]["address"], "10.231.0.9/24");
    rt.check(&list, &sb).unwrap();
    rt.status(&list).unwrap();
    std::fs::write(dir.join("full"), "").unwrap();
    let out = rt.invoke(&list, &list.plugins[0], "STATUS", None, &[]).unwrap();
    assert_eq!(out.code(), Some(50), "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().contains("no addresses left"), "{}", out.stdout);
    rt.gc(&list, &[]).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "GC with no valid attachment");
    rt.del(&list, &sb).unwrap();
    let calls = std::fs::read_to_string(dir.join("calls")).unwrap();
    let calls: Vec<&str> = calls.lines().filter(|c| *c != "VERSION").collect();
    assert_eq!(calls, ["ADD", "CHECK", "STATUS", "STATUS", "GC", "DEL"]);
}
