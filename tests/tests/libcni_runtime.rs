//! ebpf-cni driven by the real libcni (Debian's 1.1.2, what cnitool, podman 4.3 and containerd
//! 1.6 are built on) with a dual-stack conflist, for every spec version that libcni speaks:
//! VALIDATE, ADD of two pods (both addresses with their interface index, a MAC on the pod's
//! interface, as podman insists), IPv4 and IPv6 between them, CHECK, DEL twice, and nothing left:
//! not in the node, not in libcni's result cache. The driver is `tests/libcni-runtime`, built by
//! `cargo xtask test` and named by `EBPF_CNI_LIBCNI_RUNTIME`.
use std::path::{Path, PathBuf};

use ebpf_cni_tests::{CniOutput, Testbed, exec_binary, run_in};
use serde_json::{Value, json};

const V4_SUBNET: &str = "10.246.0.0/24";
const V6_SUBNET: &str = "fd00:10:246::/64";
/// The spec versions libcni 1.1.2 negotiates (it predates 1.1.0).
const VERSIONS: [&str; 3] = ["0.3.1", "0.4.0", "1.0.0"];

/// The driver binary; under `CI=true` its absence fails the test rather than skipping it.
fn runtime(test: &str) -> Option<PathBuf> {
    match std::env::var_os("EBPF_CNI_LIBCNI_RUNTIME") {
        Some(path) => Some(PathBuf::from(path)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "{test}: EBPF_CNI_LIBCNI_RUNTIME is not set (`cargo xtask test` builds it) and CI=true forbids skipping"
            )
        }
        None => {
            eprintln!("SKIPPED {test}: EBPF_CNI_LIBCNI_RUNTIME is not set (`cargo xtask test` builds it)");
            None
        }
    }
}

/// One libcni call for `pod`, in the node's namespace, as a runtime on that node would make it.
fn libcni(runtime: &Path, tb: &Testbed, verb: &str, pod: usize, conflist: &Value, cache: &Path) -> CniOutput {
    let request = json!({
        "verb": verb,
        "conflist": conflist,
        "containerID": tb.pods[pod].container_id,
        "netns": tb.pods[pod].netns_path(),
        "ifname": "eth0",
        "cniPath": [tb.plugin.dir()],
        "cacheDir": cache,
    });
    exec_binary(runtime, &tb.node.name, &[], &request.to_string()).expect("running the libcni driver")
}

fn ping(netns: &str, ip: &str) -> bool {
    run_in(netns, "ping", &["-c", "1", "-W", "2", ip]).is_ok()
}

#[test]
fn libcni_adds_checks_and_deletes_dual_stack_pods_in_every_version() {
    let test = "libcni_adds_checks_and_deletes_dual_stack_pods_in_every_version";
    let Some(runtime) = runtime(test) else { return };
    let Some(mut tb) = Testbed::for_test(test, "lcni", V4_SUBNET) else { return };
    let ranges = json!([[{ "subnet": V4_SUBNET }], [{ "subnet": V6_SUBNET }]]);
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    // Beside the IPAM dir, so the testbed removes it with its own directory, pass or fail.
    let cache = tb.data_dir().with_file_name("libcni-cache");
    let pods: Vec<usize> = (0..2).map(|_| tb.new_pod().unwrap()).collect();

    for version in VERSIONS {
        let conflist = tb.conflist(version, vec![]);
        let out = libcni(&runtime, &tb, "VALIDATE", pods[0], &conflist, &cache);
        assert!(out.success, "{version}: VALIDATE: {}", out.stderr);

        let mut addresses = Vec::new();
        for &pod in &pods {
            let out = libcni(&runtime, &tb, "ADD", pod, &conflist, &cache);
            assert!(out.success, "{version}: ADD of pod {pod}: {}", out.stderr);
            let result = out.json();
            assert_eq!(result["cniVersion"], version, "libcni converted the result to the list's version");
            let ips = result["ips"].as_array().expect("ips");
            assert_eq!(ips.len(), 2, "{version}: one address per family: {result}");
            let pod_side = &result["interfaces"][ips[0]["interface"].as_u64().expect("interface index") as usize];
            assert_eq!(pod_side["sandbox"], json!(tb.pods[pod].netns_path()), "{version}: {result}");
            assert_eq!(pod_side["mac"].as_str().map(str::len), Some(17), "{version}: a MAC on eth0");
            let address = |i: usize| ips[i]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
            assert!(address(0).starts_with("10.246.0.") && address(1).starts_with("fd00:10:246::"), "{result}");
            addresses.push((address(0), address(1)));
        }
        let (ns0, ns1) = (&tb.pods[pods[0]].netns.name, &tb.pods[pods[1]].netns.name);
        assert!(ping(ns0, &addresses[1].0), "{version}: pod 0 → pod 1 over IPv4");
        assert!(ping(ns1, &addresses[0].1), "{version}: pod 1 → pod 0 over IPv6");

        // CHECK came with 0.4.0: libcni refuses it for older lists without calling any plugin.
        let checked = if version == "0.3.1" { &[][..] } else { &pods[..] };
        for &pod in checked {
            let out = libcni(&runtime, &tb, "CHECK", pod, &conflist, &cache);
            assert!(out.success, "{version}: CHECK of pod {pod}: {}", out.stderr);
        }
        for &pod in &pods {
            for round in 0..2 {
                let out = libcni(&runtime, &tb, "DEL", pod, &conflist, &cache);
                assert!(out.success, "{version}: DEL {round} of pod {pod}: {}", out.stderr);
            }
        }
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{version}");
        assert!(tb.host_veths().unwrap().is_empty(), "{version}");
        let cached = std::fs::read_dir(cache.join("results")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(cached, 0, "{version}: libcni's cache still holds results");
    }
}
