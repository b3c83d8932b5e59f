//! The agent loads the primary network's datapath ahead of its first pod (from the node file),
//! the first ADD then uses it as it is, a configuration taking the primary network's name with
//! other settings is refused and leaves it, a changed node file replaces it while no pod uses
//! it, the last DEL unloads it, and SIGTERM unloads it unless a pod uses it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{Testbed, agent::RunningAgent};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::{Value, json};

/// The node file naming the testbed's network primary, with `pod_cidr`; the nodes file holding
/// only this node; their paths.
fn node_files(tb: &Testbed, pod_cidr: &str) -> (PathBuf, PathBuf) {
    node_files_with(tb, &[pod_cidr], json!({}))
}

/// The same with `pod_cidrs` (the first the primary network's, the others a secondary
/// network's ranges) and the node file's keys `extra` added.
fn node_files_with(tb: &Testbed, pod_cidrs: &[&str], extra: Value) -> (PathBuf, PathBuf) {
    let node_conf = tb.data_dir().with_file_name("node.json");
    let mut node = json!({
        "primaryNetwork": tb.network,
        "ipMasq": false,
        "podCIDRs": pod_cidrs,
        "bpffsRoot": tb.bpffs_root(),
        "ipamDataDir": tb.data_dir(),
    });
    for (key, value) in extra.as_object().unwrap() {
        node[key] = value.clone();
    }
    fs::write(&node_conf, node.to_string()).unwrap();
    let nodes = tb.data_dir().with_file_name("nodes.json");
    let list = json!({ "items": [{ "metadata": { "name": "n1" }, "spec": { "podCIDR": pod_cidrs[0] } }] });
    fs::write(&nodes, list.to_string()).unwrap();
    (node_conf, nodes)
}

/// `ebpf-cni agent --once` in the node's namespace with the node file: its stderr.
fn agent_once(tb: &Testbed, node_conf: &Path, nodes: &Path) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", tb.node.name))
        .arg(&tb.plugin.binary)
        .args(["agent", "--once", "--node", "n1", "--bpffs-root"])
        .args([tb.bpffs_root().as_path(), Path::new("--nodes-file"), nodes, Path::new("--node-conf"), node_conf])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

const LOADED: &str = "loaded network";

/// The testbed's configuration with its node-level settings left to the node file.
fn conf(tb: &Testbed) -> Value {
    let mut conf = tb.conf("1.1.0");
    conf.as_object_mut().unwrap().remove("bpffsRoot");
    conf["ipam"].as_object_mut().unwrap().remove("dataDir");
    conf
}

fn verb(tb: &Testbed, verb: &str, pod: usize, node_conf: &Path) -> Value {
    let netns = tb.pods[pod].netns_path();
    let out = tb.cni_env(verb, pod, &conf(tb), &netns, &[("EBPF_CNI_NODE_CONF", node_conf.to_str().unwrap())]).unwrap();
    assert!(out.success, "{verb}: {} {}", out.stdout, out.stderr);
    if out.stdout.trim().is_empty() { Value::Null } else { out.json() }
}

#[test]
fn the_first_add_uses_the_datapath_the_agent_loaded_and_the_last_del_unloads_it() {
    let test = "the_first_add_uses_the_datapath_the_agent_loaded_and_the_last_del_unloads_it";
    let Some(mut tb) = Testbed::for_test(test, "pre", "10.215.0.0/24") else { return };
    let (node_conf, nodes) = node_files(&tb, "10.215.0.0/24");
    assert!(agent_once(&tb, &node_conf, &nodes).contains(LOADED));
    let loaded = tb.program_id().unwrap();
    // Loaded and podless, it is listed like any network's datapath.
    let out = Command::new(&tb.plugin.binary)
        .args(["inspect", "settings", "--network", &tb.network, "--bpffs-root", tb.bpffs_root().to_str().unwrap()])
        .args(["--netns", &format!("/run/netns/{}", tb.node.name)])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains("10.215.0.0/24"),
        "{listed} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = tb.new_pod().unwrap();
    verb(&tb, "ADD", pod, &node_conf);
    assert_eq!(tb.program_id().unwrap(), loaded, "the first ADD loaded the datapath again");
    assert!(tb.ping(&tb.node.name, "10.215.0.2"));
    // A second run finds it loaded and leaves it.
    assert!(!agent_once(&tb, &node_conf, &nodes).contains(LOADED));
    assert_eq!(tb.program_id().unwrap(), loaded);
    verb(&tb, "DEL", pod, &node_conf);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// The `SETTINGS` the network's datapath was loaded with, as bpftool formats them.
fn loaded_settings(tb: &Testbed) -> Value {
    let settings = tb.map_dump("SETTINGS").unwrap();
    settings[0].get("formatted").unwrap_or(&settings[0])["value"].clone()
}

/// Issue 24's attack on the preload: after the agent loaded the primary network's datapath, a
/// configuration taking the primary network's name (as a NetworkAttachmentDefinition may) with a
/// wider subnet, still inside the node file's podCIDRs (a secondary network's range listed after
/// the primary's), ADDs a pod before the node's first real one. It used to replace the preload
/// with its own settings (cluster range 10.214.0.0/16), after which the real configuration's ADD
/// was refused with code 7 while the impostor's pod lived. Now it is refused with code 7 before
/// anything is touched: the preload is the same program with the same settings, and the real
/// ADD uses it and its pod answers.
#[test]
fn a_configuration_taking_the_primarys_name_cannot_replace_the_preload() {
    let test = "a_configuration_taking_the_primarys_name_cannot_replace_the_preload";
    let Some(mut tb) = Testbed::for_test(test, "prer", "10.214.1.0/24") else { return };
    let (node_conf, nodes) = node_files_with(&tb, &["10.214.1.0/24", "10.214.0.0/16"], json!({}));
    assert!(agent_once(&tb, &node_conf, &nodes).contains(LOADED));
    let (preloaded, settings) = (tb.program_id().unwrap(), loaded_settings(&tb));
    assert_eq!(settings["cluster_prefix"], 24, "{settings}");

    let impostor = tb.new_pod().unwrap();
    let mut nad = conf(&tb);
    nad["ipam"]["subnet"] = json!("10.214.0.0/16");
    let env = [("EBPF_CNI_NODE_CONF", node_conf.to_str().unwrap())];
    let out = tb.cni_env("ADD", impostor, &nad, &tb.pods[impostor].netns_path(), &env).unwrap();
    assert_eq!(out.code(), Some(7), "the impostor's ADD: {} {}", out.stdout, out.stderr);
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("ipam subnet 10.214.0.0/16 is not the primary network's pod subnet"), "{msg}");
    assert_eq!(tb.program_id().unwrap(), preloaded, "the impostor replaced the preload");
    assert_eq!(loaded_settings(&tb), settings, "the impostor changed the loaded settings");
    assert!(tb.host_veths().unwrap().is_empty() && tb.ip_files().is_empty(), "the impostor left something");

    let pod = tb.new_pod().unwrap();
    verb(&tb, "ADD", pod, &node_conf);
    assert_eq!(tb.program_id().unwrap(), preloaded, "the real ADD did not use the preload");
    assert!(tb.ping(&tb.node.name, "10.214.1.2"), "the real pod does not answer");
    // The runtime's DEL after the refused ADD finishes and leaves the real pod alone.
    let out = tb.cni_env("DEL", impostor, &nad, &tb.pods[impostor].netns_path(), &env).unwrap();
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    assert!(tb.ping(&tb.node.name, "10.214.1.2"), "the impostor's DEL cut the real pod off");
    verb(&tb, "DEL", pod, &node_conf);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// A node file that changed after the agent's preload (here it gained a clusterCIDR): the next
/// ADD's settings are what the node file says now, and it loads them in place of the unused
/// preload instead of being refused.
#[test]
fn a_changed_node_file_replaces_an_unused_preload() {
    let test = "a_changed_node_file_replaces_an_unused_preload";
    let Some(mut tb) = Testbed::for_test(test, "prec", "10.212.1.0/24") else { return };
    let (node_conf, nodes) = node_files(&tb, "10.212.1.0/24");
    assert!(agent_once(&tb, &node_conf, &nodes).contains(LOADED));
    let preloaded = tb.program_id().unwrap();
    node_files_with(&tb, &["10.212.1.0/24"], json!({ "clusterCIDR": "10.212.0.0/16" }));
    let pod = tb.new_pod().unwrap();
    verb(&tb, "ADD", pod, &node_conf);
    assert_ne!(tb.program_id().unwrap(), preloaded, "the ADD kept settings the node file no longer has");
    let settings = loaded_settings(&tb);
    assert_eq!((settings["cluster_prefix"].clone(), settings["node_pods_prefix"].clone()), (json!(16), json!(24)));
    verb(&tb, "DEL", pod, &node_conf);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn sigterm_unloads_the_preload_unless_a_pod_uses_it() {
    let test = "sigterm_unloads_the_preload_unless_a_pod_uses_it";
    let Some(mut tb) = Testbed::for_test(test, "pres", "10.213.0.0/24") else { return };
    let (node_conf, nodes) = node_files(&tb, "10.213.0.0/24");
    let args = ["--nodes-file", nodes.to_str().unwrap(), "--node-conf", node_conf.to_str().unwrap(), "--interval", "1"];
    let pod = tb.new_pod().unwrap();
    for with_pod in [false, true] {
        let mut agent = RunningAgent::start(&tb, "n1", &args).unwrap();
        let started = Instant::now();
        while tb.program_id().is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "nothing loaded: {}", agent.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        if with_pod {
            verb(&tb, "ADD", pod, &node_conf);
        }
        kill(Pid::from_raw(agent.child.id() as i32), Signal::SIGTERM).unwrap();
        let status = agent.child.wait().unwrap();
        assert!(status.success(), "{status:?}: {}", agent.log());
        assert_eq!(tb.program_id().is_ok(), with_pod, "{}", agent.log());
        if with_pod {
            assert!(tb.ping(&tb.node.name, "10.213.0.2"), "the pod lost its network");
            verb(&tb, "DEL", pod, &node_conf);
        }
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    }
}
