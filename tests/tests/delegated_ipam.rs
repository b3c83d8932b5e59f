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
