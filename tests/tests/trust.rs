//! The trust model: with a node file, a network configuration that someone less trusted wrote (a
//! Multus NetworkAttachmentDefinition) cannot change the node-level settings, masquerade, or
//! give a pod one of the node's addresses. Each refusal is code 7 and leaves nothing behind; a
//! configuration that leaves the node-level settings out gets the node file's.
use std::{fs, os::unix::fs::PermissionsExt as _, path::PathBuf};

use ebpf_cni_tests::{Testbed, run_in};
use serde_json::{Value, json};

/// A node file holding the testbed's bpffs root and IPAM dir, naming `primary` the primary
/// network (which does not masquerade) and the testbed's subnet the pods'; its path.
fn node_file(tb: &Testbed, primary: &str) -> PathBuf {
    let path = tb.data_dir().with_file_name("node.json");
    let node = json!({
        "primaryNetwork": primary,
        "ipMasq": false,
        "podCIDRs": [tb.subnet],
        "bpffsRoot": tb.bpffs_root(),
        "ipamDataDir": tb.data_dir(),
    });
    fs::write(&path, node.to_string()).unwrap();
    path
}

/// The testbed's configuration without the node-level settings it carries for the testbed.
fn conf_without_node_settings(tb: &Testbed) -> Value {
    let mut conf = tb.conf("1.1.0");
    conf.as_object_mut().unwrap().remove("bpffsRoot");
    conf["ipam"].as_object_mut().unwrap().remove("dataDir");
    conf
}

#[test]
fn node_level_settings_come_from_the_node_file_and_cannot_be_changed() {
    let test = "node_level_settings_come_from_the_node_file_and_cannot_be_changed";
    let Some(mut tb) = Testbed::for_test(test, "trust", "10.216.0.0/24") else { return };
    let path = node_file(&tb, "the-primary-network");
    let env = [("EBPF_CNI_NODE_CONF", path.to_str().unwrap())];
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();

    // Left out: the node file's bpffs root and IPAM dir are used, and every verb works.
    let mut conf = conf_without_node_settings(&tb);
    let out = tb.cni_env("ADD", pod, &conf, &netns, &env).unwrap();
    assert!(out.success, "ADD: {} {}", out.stdout, out.stderr);
    assert!(tb.pin_dir().exists() && tb.ip_files().len() == 1, "ADD did not use the node file's dirs");
    conf["prevResult"] = out.json();
    for verb in ["CHECK", "DEL"] {
        let out = tb.cni_env(verb, pod, &conf, &netns, &env).unwrap();
        assert!(out.success, "{verb}: {} {}", out.stdout, out.stderr);
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());

    // Changed, each by a configuration as a NetworkAttachmentDefinition could write it.
    let log_file = tb.data_dir().with_file_name("nad.log");
    let elsewhere = tb.data_dir().with_file_name("elsewhere");
    let cases: [(&str, Value, &str); 8] = [
        ("uplink", json!("lo"), "uplink \"lo\" is a node-level setting"),
        ("nodeIP", json!("10.216.0.9"), "nodeIP 10.216.0.9 is a node-level setting"),
        ("nodeIPv6", json!("fd00::9"), "nodeIPv6 fd00::9 is a node-level setting"),
        ("bpffsRoot", json!(elsewhere), "bpffsRoot"),
        ("logFile", json!(log_file), "logFile"),
        ("ipam", json!({ "type": "host-local", "subnet": tb.subnet, "dataDir": elsewhere }), "ipam.dataDir"),
        ("ipMasq", json!(true), "only the node's primary network may masquerade"),
        ("masqPortRange", json!("1-65535"), "masqPortRange \"1-65535\" is a node-level setting"),
    ];
    for (key, value, says) in cases {
        let mut hostile = conf_without_node_settings(&tb);
        hostile[key] = value;
        for verb in ["ADD", "CHECK"] {
            let out = tb.cni_env(verb, pod, &hostile, &netns, &env).unwrap();
            assert!(!out.success, "{key}: {verb} succeeded");
            assert_eq!(out.code(), Some(7), "{key}: {verb}: {}", out.stdout);
            let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
            assert!(msg.contains(says) && msg.contains(path.to_str().unwrap()), "{key}: {msg}");
        }
        // DEL always finishes: with the node's values, as a well-behaved configuration has them.
        let out = tb.cni_env("DEL", pod, &hostile, &netns, &env).unwrap();
        assert!(out.success, "{key}: DEL: {} {}", out.stdout, out.stderr);
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{key}");
        assert!(!elsewhere.exists() && !log_file.exists(), "{key}: written where the configuration said");
    }

    // Under the primary network's name, its datapath settings are the node file's too: a
    // configuration that takes the name cannot load it masquerading or with another cluster CIDR
    // (and so lock the real one out); repeating the node's values is fine.
    let primary = node_file(&tb, &tb.network);
    let primary_env = [("EBPF_CNI_NODE_CONF", primary.to_str().unwrap())];
    for (key, value) in [("ipMasq", json!(true)), ("clusterCIDR", json!("10.0.0.0/8"))] {
        let mut taken = conf_without_node_settings(&tb);
        taken[key] = value;
        let out = tb.cni_env("ADD", pod, &taken, &netns, &primary_env).unwrap();
        assert_eq!(out.code(), Some(7), "{key}: {}", out.stdout);
        assert!(out.json()["msg"].as_str().unwrap_or_default().contains("is a node-level setting"), "{}", out.stdout);
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{key}");
    }
    let mut repeated = tb.conf("1.1.0");
    repeated["ipMasq"] = json!(false);
    let out = tb.cni_env("ADD", pod, &repeated, &netns, &primary_env).unwrap();
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// A pod address gets a host route through the pod's veth, which outranks the node's own
/// routes to it: with the node file's `podCIDRs`, a range elsewhere (here the next /24, as
/// another node's pods or a LAN host would be) is refused, and its reservation released.
#[test]
fn pod_addresses_stay_inside_the_node_files_pod_cidrs() {
    let test = "pod_addresses_stay_inside_the_node_files_pod_cidrs";
    let Some(mut tb) = Testbed::for_test(test, "trustc", "10.216.3.0/24") else { return };
    let path = node_file(&tb, "the-primary-network");
    let env = [("EBPF_CNI_NODE_CONF", path.to_str().unwrap())];
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    let mut elsewhere = conf_without_node_settings(&tb);
    elsewhere["ipam"]["subnet"] = json!("10.216.4.0/24");
    let out = tb.cni_env("ADD", pod, &elsewhere, &netns, &env).unwrap();
    assert_eq!(out.code(), Some(7), "{} {}", out.stdout, out.stderr);
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("10.216.4.2 is outside the node file's podCIDRs (10.216.3.0/24)"), "{msg}");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    let out = tb.cni_env("ADD", pod, &conf_without_node_settings(&tb), &netns, &env).unwrap();
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    let out = tb.cni_env("DEL", pod, &conf_without_node_settings(&tb), &netns, &env).unwrap();
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// A node file that others may write is no boundary: every verb fails, DEL included, and says
/// which file and why.
#[test]
fn a_node_file_others_may_write_is_refused() {
    let test = "a_node_file_others_may_write_is_refused";
    let Some(mut tb) = Testbed::for_test(test, "trustw", "10.216.1.0/24") else { return };
    let path = node_file(&tb, &tb.network);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    for verb in ["ADD", "DEL", "STATUS"] {
        let out = tb.cni_env(verb, pod, &tb.conf("1.1.0"), &netns, &[("EBPF_CNI_NODE_CONF", path.to_str().unwrap())]);
        let out = out.unwrap();
        assert_eq!(out.code(), Some(7), "{verb}: {}", out.stdout);
        assert!(out.json()["msg"].as_str().unwrap_or_default().contains("writable by nobody else"), "{}", out.stdout);
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// A pod asking for an address the node holds (here by CNI_ARGS, as with the `ips` capability
/// or a range written around it) would take that address's traffic from the node: refused, with
/// or without a node file, and its reservation released.
#[test]
fn a_pod_cannot_take_an_address_of_the_node() {
    let test = "a_pod_cannot_take_an_address_of_the_node";
    let Some(mut tb) = Testbed::for_test(test, "trusta", "10.216.2.0/24") else { return };
    run_in(&tb.node.name, "ip", &["addr", "add", "10.216.2.77/32", "dev", "lo"]).unwrap();
    let pod = tb.new_pod().unwrap();
    let netns = tb.pods[pod].netns_path();
    let out = tb.cni_env("ADD", pod, &tb.conf("1.1.0"), &netns, &[("CNI_ARGS", "IP=10.216.2.77")]).unwrap();
    assert_eq!(out.code(), Some(7), "{} {}", out.stdout, out.stderr);
    assert!(out.json()["msg"].as_str().unwrap_or_default().contains("10.216.2.77 is an address of the node"));
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // The same for IPv6.
    run_in(&tb.node.name, "ip", &["-6", "addr", "add", "fd00:216:2::77/128", "dev", "lo"]).unwrap();
    let mut ipv6 = tb.conf("1.1.0");
    ipv6["ipam"] = json!({ "type": "host-local", "subnet": "fd00:216:2::/64", "dataDir": tb.data_dir() });
    let out = tb.cni_env("ADD", pod, &ipv6, &netns, &[("CNI_ARGS", "IP=fd00:216:2::77")]).unwrap();
    assert_eq!(out.code(), Some(7), "{} {}", out.stdout, out.stderr);
    assert!(out.json()["msg"].as_str().unwrap_or_default().contains("fd00:216:2::77 is an address of the node"));
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // Nor a link-local one, where clouds serve instance metadata, whatever the range says.
    let mut metadata = tb.conf("1.1.0");
    metadata["ipam"]["subnet"] = json!("169.254.169.0/24");
    let out = tb.cni_env("ADD", pod, &metadata, &netns, &[("CNI_ARGS", "IP=169.254.169.254")]).unwrap();
    assert_eq!(out.code(), Some(7), "{} {}", out.stdout, out.stderr);
    assert!(out.json()["msg"].as_str().unwrap_or_default().contains("not a unicast address a pod may hold"));
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    // Another address of the range is fine.
    let out = tb.cni_env("ADD", pod, &tb.conf("1.1.0"), &netns, &[("CNI_ARGS", "IP=10.216.2.78")]).unwrap();
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
