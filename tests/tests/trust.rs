//! The trust model: with a node file, a network configuration that someone less trusted wrote (a
//! Multus NetworkAttachmentDefinition) cannot change the node-level settings, masquerade, or
//! give a pod one of the node's addresses. Each refusal is code 7 and leaves nothing behind; a
//! configuration that leaves the node-level settings out gets the node file's.
use std::{fs, os::unix::fs::PermissionsExt as _, path::PathBuf};

use ebpf_cni_tests::{Testbed, run, run_in};
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

/// The `ENDPOINTS` entry of the IPv6 link-local address a pod's kernel makes of `mac` (EUI-64),
/// as bpftool formats its value; None when there is none.
fn link_local_entry(tb: &Testbed, mac: [u8; 6]) -> Option<Value> {
    let [a, b, c, d, e, f] = mac;
    let address = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 2, b, c, 0xff, 0xfe, d, e, f];
    let key: Vec<String> = [6, 0, 0, 0].iter().chain(&address).map(u8::to_string).collect();
    let pin = tb.map_pin("ENDPOINTS");
    let mut args = vec!["-j", "map", "lookup", "pinned", pin.to_str().unwrap(), "key"];
    args.extend(key.iter().map(String::as_str));
    let out = run("bpftool", &args).ok()?;
    let entry: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(entry.get("formatted").unwrap_or(&entry)["value"].clone())
}

/// Issue 24, item 7: a pod asking for another pod's MAC (`CNI_ARGS MAC=`, or the `mac`
/// capability) used to get it, and with it the other pod's IPv6 link-local `ENDPOINTS` entry
/// (the EUI-64 address of that MAC), which then vouched for the new pod's veth; the new pod's
/// DEL removed the entry, and the first pod's neighbour discovery was dropped as spoofed from
/// then on. Now the ADD is refused with code 103 and leaves nothing, the entry stays the first
/// pod's, and the first pod's link-local traffic (to its host veth, neighbour discovery included)
/// and its IPv6 to another pod still pass after its neighbours are flushed.
#[test]
fn a_pod_cannot_take_another_pods_mac() {
    let test = "a_pod_cannot_take_another_pods_mac";
    let Some(mut tb) = Testbed::for_test(test, "trustm", "10.216.5.0/24") else { return };
    let ranges = json!([[{ "subnet": tb.subnet }], [{ "subnet": "fd00:216:5::/64" }]]);
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    let (first, other, thief) = (tb.new_pod().unwrap(), tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let mac = [0x0a, 0x58, 0x0a, 0xd8, 0x05, 0x0a];
    let args = "MAC=0a:58:0a:d8:05:0a";
    let add = |pod: usize, more: &[(&str, &str)], conf: &Value| {
        tb.cni_env("ADD", pod, conf, &tb.pods[pod].netns_path(), more).unwrap()
    };
    let out = add(first, &[("CNI_ARGS", args)], &tb.conf("1.1.0"));
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    let first_host = out.json()["interfaces"][0]["name"].as_str().unwrap().to_string();
    let out = add(other, &[], &tb.conf("1.1.0"));
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    let other_ipv6 = out.json()["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    let entry = link_local_entry(&tb, mac).expect("the first pod's link-local entry");
    let (veths, ip_files) = (tb.host_veths().unwrap(), tb.ip_files());

    // Asked for by CNI_ARGS, and by runtimeConfig (the `mac` capability).
    let mut capability = tb.conf("1.1.0");
    capability["runtimeConfig"] = json!({ "mac": "0a:58:0a:d8:05:0a" });
    for (how, more, conf) in
        [("CNI_ARGS", vec![("CNI_ARGS", args)], tb.conf("1.1.0")), ("runtimeConfig", vec![], capability)]
    {
        let out = add(thief, &more, &conf);
        assert_eq!(out.code(), Some(103), "{how}: {} {}", out.stdout, out.stderr);
        let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains("MAC 0a:58:0a:d8:05:0a is another pod's"), "{how}: {msg}");
        assert_eq!((tb.host_veths().unwrap(), tb.ip_files()), (veths.clone(), ip_files.clone()), "{how}: left");
        assert_eq!(link_local_entry(&tb, mac).as_ref(), Some(&entry), "{how}: the entry changed");
        // The runtime's DEL after the failed ADD.
        let out = tb.cni_env("DEL", thief, &conf, &tb.pods[thief].netns_path(), &more).unwrap();
        assert!(out.success, "{how}: DEL: {} {}", out.stdout, out.stderr);
        assert_eq!(link_local_entry(&tb, mac).as_ref(), Some(&entry), "{how}: DEL removed the entry");
    }
    // The first pod's link-local traffic (here to its host veth's link-local address, its
    // neighbour solicitation included) is still vouched for: it was dropped as spoofed before.
    let first_ns = tb.pods[first].netns.name.clone();
    let out = run_in(&tb.node.name, "ip", &["-6", "-o", "addr", "show", "dev", &first_host, "scope", "link"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let host_link_local = text.split_whitespace().skip_while(|w| *w != "inet6").nth(1).unwrap().split('/').next();
    let host_link_local = format!("{}%eth0", host_link_local.unwrap());
    let ping6 = |to: &str| run_in(&first_ns, "ping", &["-6", "-c", "1", "-W", "2", to]).is_ok();
    run_in(&first_ns, "ip", &["-6", "neigh", "flush", "all"]).unwrap();
    let spoofed = tb.drops(ebpf_common::DropReason::SpoofedSource).unwrap();
    assert!(ping6(&host_link_local), "the first pod lost its link-local traffic");
    assert!(ping6(&other_ipv6), "the first pod no longer reaches the other pod");
    assert_eq!(tb.drops(ebpf_common::DropReason::SpoofedSource).unwrap(), spoofed, "dropped as spoofed");
    // Without a MAC of its own asked for, the pod is added as any other.
    let out = add(thief, &[], &tb.conf("1.1.0"));
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    for pod in [first, other, thief] {
        tb.del(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
