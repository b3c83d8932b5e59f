//! The CNI contract as a runtime sees it: VERSION, results per spec version, and bad input
//! getting the right error code with nothing left behind.
use ebpf_cni_tests::Testbed;
use serde_json::{Value, json};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

#[test]
fn version_reports_every_supported_version() {
    let Some(tb) = Testbed::for_test("version_reports_every_supported_version", "ver", "10.247.0.0/24") else { return };
    for asked in ["0.3.1", "1.0.0", "1.1.0"] {
        let out = tb.cni_raw(&[("CNI_COMMAND", "VERSION")], &json!({ "cniVersion": asked }).to_string()).unwrap();
        assert!(out.success);
        let reply: Value = serde_json::from_str(&out.stdout).expect("stdout is exactly one JSON document");
        assert_eq!(reply["cniVersion"], asked);
        assert_eq!(reply["supportedVersions"], json!(VERSIONS));
    }
}

#[test]
fn add_result_has_the_format_of_each_version() {
    let Some(mut tb) = Testbed::for_test("add_result_has_the_format_of_each_version", "fmt", "10.246.0.0/24") else {
        return;
    };
    for version in VERSIONS {
        let pod = tb.new_pod().unwrap();
        let out = tb.cni("ADD", pod, &tb.conf(version)).unwrap();
        assert!(out.success, "{version}: {}", out.stderr);
        let result: Value = serde_json::from_str(&out.stdout).expect("stdout is exactly one JSON document");
        assert_eq!(result["cniVersion"], version);
        let ifaces = result["interfaces"].as_array().unwrap();
        assert_eq!(ifaces.len(), 2);
        assert_eq!(ifaces[1]["name"], "eth0");
        assert_eq!(ifaces[1]["sandbox"], tb.pods[pod].netns_path());
        for iface in ifaces {
            let mac = iface["mac"].as_str().unwrap();
            assert_eq!(mac.len(), 17, "{version}: bad mac {mac}");
        }
        let ip = &result["ips"][0];
        assert_eq!(ip["interface"], 1, "{version}: ips[].interface must point at eth0");
        assert!(ip["address"].as_str().unwrap().ends_with("/24"));
        assert_eq!(ip["gateway"], "10.246.0.1");
        assert_eq!(ip.get("version").is_some(), version.starts_with("0."), "{version}: ips[].version");
        assert_eq!(result["routes"][0]["dst"], "0.0.0.0/0");
        let del = tb.cni("DEL", pod, &tb.conf(version)).unwrap();
        assert!(del.success, "{version}: DEL {}", del.stdout);
    }
}

#[test]
fn bad_input_gets_its_code_and_leaves_nothing() {
    let Some(mut tb) = Testbed::for_test("bad_input_gets_its_code_and_leaves_nothing", "bad", "10.245.0.0/24") else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    let good = tb.conf("1.0.0");
    let with = |key: &str, value: Value| {
        let mut c = good.clone();
        c[key] = value;
        c.to_string()
    };
    let with_masq_uplink = |uplink: &str| {
        let mut c = good.clone();
        c["ipMasq"] = json!(true);
        c["uplink"] = json!(uplink);
        c.to_string()
    };
    let mut bad_cidr = good.clone();
    bad_cidr["ipam"]["subnet"] = json!("10.0.0.0/33");
    let env = |id: &'static str, ifname: &'static str, ns: &str| {
        vec![
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", id.to_string()),
            ("CNI_NETNS", ns.to_string()),
            ("CNI_IFNAME", ifname.to_string()),
            ("CNI_PATH", "/usr/lib/cni".to_string()),
        ]
    };
    /// What is wrong, the environment, stdin, and the code the spec (or we) assign.
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, String, u64);
    let cases: Vec<Case> = vec![
        ("malformed JSON", env("c1", "eth0", &netns), "{\"cniVersion\":".into(), 6),
        ("unknown version", env("c1", "eth0", &netns), with("cniVersion", json!("0.2.0")), 1),
        ("path traversal in container ID", env("../../etc", "eth0", &netns), good.to_string(), 4),
        ("overlong ifname", env("c1", "eth0-is-far-too-long", &netns), good.to_string(), 4),
        ("unknown command", vec![("CNI_COMMAND", "FROB".into())], good.to_string(), 4),
        ("bad CIDR", env("c1", "eth0", &netns), bad_cidr.to_string(), 7),
        ("missing netns", env("c1", "eth0", "/run/netns/ebpf-cni-does-not-exist"), good.to_string(), 3),
        ("netns that is not a namespace", env("c1", "eth0", "/etc/hostname"), good.to_string(), 4),
        ("ipMasq, no default route", env("c1", "eth0", &netns), with("ipMasq", json!(true)), 7),
        ("bad clusterCIDR", env("c1", "eth0", &netns), with("clusterCIDR", json!("10.1.0.0/40")), 7),
        ("uplink that does not exist", env("c1", "eth0", &netns), with_masq_uplink("nope0"), 7),
    ];
    for (what, env, stdin, code) in cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = tb.cni_raw(&env, &stdin).unwrap();
        assert!(!out.success, "{what}: succeeded");
        let err: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|_| panic!("{what}: stdout {:?}", out.stdout));
        assert_eq!(err["code"], code, "{what}: {err}");
        assert!(err["msg"].as_str().is_some_and(|m| !m.is_empty()), "{what}: no msg");
        assert!(err.get("cniVersion").is_some() && err.get("details").is_some(), "{what}: {err}");
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{what}");
    }
}
