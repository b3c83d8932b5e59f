//! CHECK finds each piece of an attachment that is missing or differs from ADD's result, and
//! says which; it changes nothing.
use ebpf_cni_tests::{Testbed, run_in, runtime::Runtime};
use serde_json::{Value, json};

/// Breaks one piece of a fresh attachment: (testbed, pod, its address, ADD's result).
type Breaker = fn(&Testbed, usize, &str, &mut Value);

#[test]
fn check_names_what_is_wrong() {
    let Some(mut tb) = Testbed::for_test("check_names_what_is_wrong", "check", "10.241.0.0/24") else { return };
    let rt = Runtime::for_testbed(&tb);
    let list = rt.load(&tb.conflist("1.0.0", vec![])).unwrap();
    let cases: Vec<(&str, Breaker, &str)> = vec![
        ("nothing", |_, _, _, _| {}, ""),
        ("pod MAC", |_, _, _, r| r["interfaces"][1]["mac"] = json!("02:00:00:00:00:01"), "MAC"),
        ("host MAC", |_, _, _, r| r["interfaces"][0]["mac"] = json!("02:00:00:00:00:01"), "MAC"),
        (
            "pod address",
            |tb, pod, ip, _| {
                drop(run_in(&tb.pods[pod].netns.name, "ip", &["addr", "del", &format!("{ip}/24"), "dev", "eth0"]))
            },
            "no address",
        ),
        (
            "pod route",
            |tb, pod, _, _| drop(run_in(&tb.pods[pod].netns.name, "ip", &["route", "del", "default"])),
            "route",
        ),
        ("host route", |tb, _, ip, _| drop(run_in(&tb.node.name, "ip", &["route", "del", &format!("{ip}/32")])), "/32"),
        (
            "tc filter",
            |tb, _, _, _| {
                for veth in tb.host_veths().unwrap() {
                    run_in(&tb.node.name, "tc", &["filter", "del", "dev", &veth, "ingress"]).unwrap();
                }
            },
            "from_pod",
        ),
        ("endpoint entry", |tb, _, ip, _| tb.remove_endpoint(ip.parse().unwrap()), "endpoint"),
        (
            "IP reservation",
            |tb, _, ip, _| std::fs::remove_file(tb.data_dir().join(&tb.network).join(ip)).unwrap(),
            "not reserved",
        ),
    ];
    for (what, break_it, expected) in cases {
        let pod = tb.new_pod().unwrap();
        let sb = tb.sandbox(pod);
        let mut result = rt.add(&list, &sb).unwrap();
        let ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        break_it(&tb, pod, &ip, &mut result);
        let out = rt.invoke(&list, &list.plugins[0], "CHECK", Some(&sb), &[("prevResult", result)]).unwrap();
        if expected.is_empty() {
            assert!(out.success, "{what}: {}", out.stdout);
            assert!(out.stdout.trim().is_empty(), "CHECK printed {}", out.stdout);
        } else {
            assert_eq!(out.code(), Some(104), "{what}: {} {}", out.stdout, out.stderr);
            let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
            assert!(msg.contains(expected), "{what}: {msg:?} does not say {expected:?}");
        }
        rt.del(&list, &sb).unwrap();
    }
    // Without the cached result there is nothing to check against.
    let pod = tb.new_pod().unwrap();
    let sb = tb.sandbox(pod);
    rt.add(&list, &sb).unwrap();
    let out = rt.invoke(&list, &list.plugins[0], "CHECK", Some(&sb), &[]).unwrap();
    assert_eq!(out.code(), Some(7), "{}", out.stdout);
    rt.del(&list, &sb).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
