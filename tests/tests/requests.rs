//! What a runtime asks of one attachment: a fixed address and a MAC through `CNI_ARGS`
//! (podman's network reload), `runtimeConfig` (the `ips` and `mac` capabilities) or
//! `args.cni`; unknown `CNI_ARGS` keys; and ebpf-cni placed after another plugin.
use ebpf_cni_tests::{Testbed, runtime::Runtime};
use serde_json::json;

fn add_with_args(tb: &Testbed, pod: usize, cni_args: &str) -> ebpf_cni_tests::CniOutput {
    let netns = tb.sandbox(pod).netns;
    tb.cni_env("ADD", pod, &tb.conf("1.0.0"), &netns, &[("CNI_ARGS", cni_args)]).unwrap()
}

#[test]
fn cni_args_ip_and_mac_survive_a_podman_reload() {
    let Some(mut tb) = Testbed::for_test("cni_args_ip_and_mac_survive_a_podman_reload", "args", "10.235.0.0/24") else {
        return;
    };
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let args = "IgnoreUnknown=1;K8S_POD_NAME=web-0;IP=10.235.0.77;MAC=0a:58:0a:eb:00:4d";
    let out = add_with_args(&tb, a, args);
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    assert_eq!(out.json()["ips"][0]["address"], "10.235.0.77/24");
    assert_eq!(out.json()["interfaces"][1]["mac"], "0a:58:0a:eb:00:4d");
    // `podman network reload`: DEL, then ADD in the same live netns asking for the same again.
    tb.del(a).unwrap();
    let again = add_with_args(&tb, a, args);
    assert_eq!(again.json()["ips"][0]["address"], "10.235.0.77/24", "{}", again.stdout);
    assert_eq!(again.json()["interfaces"][1]["mac"], "0a:58:0a:eb:00:4d");
    // Another pod asking for the same address is refused, and leaves nothing.
    let taken = add_with_args(&tb, b, "IP=10.235.0.77");
    assert_eq!(taken.code(), Some(103), "{}", taken.stdout);
    let unknown = add_with_args(&tb, b, "FOO=bar");
    assert_eq!(unknown.code(), Some(4), "{}", unknown.stdout);
    assert_eq!(add_with_args(&tb, b, "IP=10.9.9.9").code(), Some(7), "an address outside the range");
    assert_eq!(tb.host_veths().unwrap().len(), 1);
    assert_eq!(tb.ip_files(), vec!["10.235.0.77".to_string()]);
    let ip_b = tb.add(b).unwrap();
    assert!(tb.ping(&tb.pods[a].netns.name, &ip_b));
    tb.del(a).unwrap();
    tb.del(b).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn runtime_config_and_args_request_addresses() {
    let Some(mut tb) = Testbed::for_test("runtime_config_and_args_request_addresses", "rtcfg", "10.234.0.0/24") else {
        return;
    };
    let rt = Runtime::for_testbed(&tb);
    let mut conflist = tb.conflist("1.0.0", vec![]);
    conflist["plugins"][0]["capabilities"] = json!({ "ips": true, "mac": true });
    let list = rt.load(&conflist).unwrap();
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let mut sb_a = tb.sandbox(a);
    sb_a.capability_args.insert("ips".into(), json!(["10.234.0.50/24"]));
    sb_a.capability_args.insert("mac".into(), json!("c2:11:22:33:44:55"));
    let result = rt.add(&list, &sb_a).unwrap();
    assert_eq!(result["ips"][0]["address"], "10.234.0.50/24");
    assert_eq!(result["interfaces"][1]["mac"], "c2:11:22:33:44:55");
    rt.check(&list, &sb_a).unwrap();
    // `args.cni.ips` in the plugin's own configuration (CNI conventions).
    let mut with_args = list.clone();
    with_args.plugins[0]["args"] = json!({ "cni": { "ips": ["10.234.0.60"] } });
    let sb_b = tb.sandbox(b);
    let result = rt.add(&with_args, &sb_b).unwrap();
    assert_eq!(result["ips"][0]["address"], "10.234.0.60/24");
    assert!(tb.ping(&tb.pods[a].netns.name, "10.234.0.60"));
    rt.del(&list, &sb_a).unwrap();
    rt.del(&with_args, &sb_b).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn refuses_to_run_after_another_plugin() {
    let Some(mut tb) = Testbed::for_test("refuses_to_run_after_another_plugin", "later", "10.233.0.0/24") else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    let mut conf = tb.conf("1.0.0");
    conf["prevResult"] =
        json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "eth0", "sandbox": "/x" }], "ips": [] });
    let out = tb.cni("ADD", pod, &conf).unwrap();
    assert_eq!(out.code(), Some(7), "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().contains("first plugin"), "{}", out.stdout);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
