//! `ebpf-cni install --root <dir>`: the binary and the conflist land in a throwaway root as the
//! DaemonSet's init container puts them on a node, from a pod CIDR given or read from a Node
//! object (both of a dual-stack Node's); and a runtime using exactly what was installed gives a
//! pod its address, one of each family on a dual-stack node.
use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use ebpf_cni_tests::{
    Cluster, EXT_SERVER_V6, NODE1_UPLINK_IP, NODE1_UPLINK_IPV6, Testbed, run_in,
    runtime::{Runtime, Sandbox},
};
use serde_json::{Value, json};

fn install(binary: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(binary).arg("install").args(args).env_remove("NODE_NAME").output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn conflist(root: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(root.join("etc/cni/net.d/10-ebpf-cni.conflist")).unwrap()).unwrap()
}

/// A throwaway root inside the testbed's own directory (removed with it).
fn root_of(tb: &Testbed) -> PathBuf {
    tb.data_dir().with_file_name("root")
}

#[test]
fn installs_binary_and_conflist_into_a_root() {
    let Some(mut tb) = Testbed::for_test("installs_binary_and_conflist_into_a_root", "inst", "10.251.7.0/24") else {
        return;
    };
    let root = root_of(&tb);
    let binary = tb.plugin.binary.clone();
    let root_arg = root.to_str().unwrap();
    let args = [
        "--root",
        root_arg,
        "--pod-cidr",
        "10.251.7.0/24",
        "--cluster-cidr",
        "10.251.0.0/16",
        "--masquerade",
        "--node-ip",
        "192.0.2.7",
    ];
    let (ok, stdout, stderr) = install(&binary, &args);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("wrote"), "{stdout}");

    let installed = root.join("opt/cni/bin/ebpf-cni");
    assert_eq!(fs::read(&installed).unwrap(), fs::read(&binary).unwrap(), "a byte-for-byte copy");
    assert_eq!(fs::metadata(&installed).unwrap().permissions().mode() & 0o777, 0o755);
    let list = conflist(&root);
    assert_eq!(list["cniVersion"], "1.0.0");
    assert_eq!(list["name"], "ebpf-cni");
    let plugin = &list["plugins"][0];
    assert_eq!(plugin["type"], "ebpf-cni");
    assert_eq!(plugin["ipMasq"], true);
    assert_eq!(plugin["clusterCIDR"], "10.251.0.0/16");
    assert_eq!(plugin["ipam"]["ranges"][0][0]["subnet"], "10.251.7.0/24");
    let node_file: Value =
        serde_json::from_str(&fs::read_to_string(root.join("etc/ebpf-cni/node.json")).unwrap()).unwrap();
    assert_eq!(
        node_file,
        json!({ "primaryNetwork": "ebpf-cni", "ipMasq": true, "clusterCIDR": "10.251.0.0/16", "podCIDRs": ["10.251.7.0/24"],
                "nodeIP": "192.0.2.7" }),
        "the conflist's network is the primary one, with its datapath settings and the node's address, and pods \
         stay in the pod CIDR"
    );
    for dir in ["opt/cni/bin", "etc/cni/net.d", "etc/ebpf-cni"] {
        let names: Vec<String> =
            fs::read_dir(root.join(dir)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 1, "no temporary file left in {dir}: {names:?}");
    }

    // Again: the binary is replaced (a new inode: running copies keep theirs), the conflist,
    // unchanged, is not rewritten.
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    let node_path = root.join("etc/ebpf-cni/node.json");
    let (conf_inode, bin_inode) = (inode(&root.join("etc/cni/net.d/10-ebpf-cni.conflist")), inode(&installed));
    let node_inode = inode(&node_path);
    let (ok, stdout, _) = install(&binary, &args);
    assert!(ok && stdout.contains("up to date"), "{stdout}");
    assert_eq!(inode(&root.join("etc/cni/net.d/10-ebpf-cni.conflist")), conf_inode);
    assert_eq!(inode(&node_path), node_inode);
    assert_ne!(inode(&installed), bin_inode);

    // A runtime with the installed binary first in CNI_PATH and the installed conflist (its
    // state redirected into the testbed instead of the machine's /var/lib/cni and bpffs).
    let result = add_with_installed(&mut tb, &root);
    assert_eq!(result["ips"][0]["address"], "10.251.7.2/24", "{result}");
}

/// ADD then DEL of a new pod by a runtime with the installed binary first in CNI_PATH, the
/// installed conflist and the installed node file (their state redirected into the testbed
/// instead of the machine's /var/lib/cni and bpffs: in the node file, which holds those
/// settings); the ADD's result.
fn add_with_installed(tb: &mut Testbed, root: &Path) -> Value {
    let mut list = conflist(root);
    list["plugins"][0]["ipMasq"] = json!(false);
    let mut node_file: Value =
        serde_json::from_str(&fs::read_to_string(root.join("etc/ebpf-cni/node.json")).unwrap()).unwrap();
    node_file["ipMasq"] = json!(false);
    node_file["bpffsRoot"] = json!(tb.bpffs_root());
    node_file["ipamDataDir"] = json!(tb.data_dir());
    let node_path = tb.data_dir().with_file_name("node.json");
    fs::write(&node_path, node_file.to_string()).unwrap();
    let mut runtime = Runtime::for_testbed(tb);
    runtime.search_first(root.join("opt/cni/bin"));
    runtime.use_node_conf(&node_path);
    let list = runtime.load(&list).unwrap();
    let pod = tb.new_pod().unwrap();
    let sandbox: Sandbox = tb.sandbox(pod);
    let result = runtime.add(&list, &sandbox).unwrap();
    runtime.del(&list, &sandbox).unwrap();
    assert!(tb.leftovers().unwrap().is_empty());
    result
}

/// A dual-stack Node (spec.podCIDRs lists IPv6 first here, as an IPv6-first cluster does): one
/// range set per family, IPv4 first, `clusterCIDR` in the comma form, and pods get one address
/// of each family.
#[test]
fn a_dual_stack_node_gives_both_families() {
    let Some(mut tb) = Testbed::for_test("a_dual_stack_node_gives_both_families", "instd", "10.251.9.0/24") else {
        return;
    };
    let root = root_of(&tb);
    let nodes = tb.data_dir().with_file_name("nodes.json");
    let node = json!({"metadata": {"name": "n1"},
                      "spec": {"podCIDR": "fd00:10:251:9::/64", "podCIDRs": ["fd00:10:251:9::/64", "10.251.9.0/24"]}});
    fs::write(&nodes, node.to_string()).unwrap();
    let args = ["--node", "n1", "--nodes-file", nodes.to_str().unwrap(), "--root", root.to_str().unwrap()];
    let cluster = ["--cluster-cidr", "10.251.0.0/16,fd00:10:251::/56"];
    let (ok, stdout, stderr) = install(&tb.plugin.binary, &[&args[..], &cluster].concat());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("from 10.251.9.0/24,fd00:10:251:9::/64"), "{stdout}");
    let plugin = conflist(&root)["plugins"][0].clone();
    assert_eq!(
        plugin["ipam"]["ranges"],
        json!([[{ "subnet": "10.251.9.0/24" }], [{ "subnet": "fd00:10:251:9::/64" }]])
    );
    assert_eq!(plugin["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]));
    assert_eq!(plugin["clusterCIDR"], "10.251.0.0/16,fd00:10:251::/56");

    let result = add_with_installed(&mut tb, &root);
    let ips: Vec<&str> = result["ips"].as_array().unwrap().iter().map(|ip| ip["address"].as_str().unwrap()).collect();
    assert_eq!(ips, ["10.251.9.2/24", "fd00:10:251:9::2/64"], "{result}");

    // The same from the flag, one value per family in either order, gives the same conflist.
    let again = ["--pod-cidr", "fd00:10:251:9::/64", "--pod-cidr", "10.251.9.0/24", "--root", root.to_str().unwrap()];
    let (ok, stdout, stderr) = install(&tb.plugin.binary, &[&again[..], &cluster].concat());
    assert!(ok && stdout.contains("up to date"), "{stdout} {stderr}");
}

#[test]
fn reads_the_pod_cidr_of_its_node() {
    let Some(tb) = Testbed::for_test("reads_the_pod_cidr_of_its_node", "instn", "10.251.8.0/24") else {
        return;
    };
    let root = root_of(&tb);
    let nodes = tb.data_dir().with_file_name("nodes.json");
    fs::write(
        &nodes,
        json!({"kind": "NodeList", "items": [
            {"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.251.8.0/24"}},
            {"metadata": {"name": "n2"}, "spec": {}},
        ]})
        .to_string(),
    )
    .unwrap();
    let (root_arg, nodes_arg) = (root.to_str().unwrap(), nodes.to_str().unwrap());
    let (ok, _, stderr) = install(&tb.plugin.binary, &["--root", root_arg, "--node", "n1", "--nodes-file", nodes_arg]);
    assert!(ok, "{stderr}");
    assert_eq!(conflist(&root)["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.251.8.0/24");
    assert_eq!(conflist(&root)["plugins"][0]["ipMasq"], false);

    // Nothing is written when the pod CIDR cannot be known.
    let empty = root.with_file_name("root2");
    for (args, says) in [
        (vec!["--node", "n2", "--nodes-file", nodes_arg], "has no spec.podCIDR"),
        (vec!["--node", "n9", "--nodes-file", nodes_arg], "no node named"),
        (vec![], "give --pod-cidr"),
        (vec!["--pod-cidr", "10.0.0.0/33"], "invalid value"),
        (vec!["--pod-cidr", "10.0.0.0/24,10.0.1.0/24"], "at most one CIDR per address family"),
    ] {
        let mut full = vec!["--root", empty.to_str().unwrap()];
        full.extend(args);
        let (ok, _, stderr) = install(&tb.plugin.binary, &full);
        assert!(!ok && stderr.contains(says), "{full:?}: {stderr}");
        assert!(!empty.exists(), "{full:?} wrote something");
    }
}

/// Issue 24, item 10: on a masquerading dual-stack node the installer writes the uplink's
/// addresses into the node file (`nodeIP`, `nodeIPv6`), read once. ADD used to read the IPv6 one
/// from the uplink every time: once the uplink was renumbered, every ADD computed other settings
/// than the loaded datapath's and was refused with code 7 until the network's last pod was gone.
/// Now ADD takes the node file's, and a pod added after the renumbering gets its network.
#[test]
fn the_installer_writes_the_node_addresses_and_a_renumbered_uplink_does_not_refuse_add() {
    let test = "the_installer_writes_the_node_addresses_and_a_renumbered_uplink_does_not_refuse_add";
    let Some(mut c) = Cluster::for_test(test, "instr", "10.251.0.0/16", ["10.251.11.0/24", "10.251.12.0/24"]) else {
        return;
    };
    c.add_ipv6("fd00:10:251::/56", ["fd00:10:251:11::/64", "fd00:10:251:12::/64"]).unwrap();
    let tb = &mut c.nodes[0];
    let root = root_of(tb);
    // In the node's namespace, as the DaemonSet's init container runs in the host's.
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", tb.node.name))
        .arg(&tb.plugin.binary)
        .args(["install", "--root", root.to_str().unwrap(), "--network", &tb.network, "--masquerade"])
        .args(["--pod-cidr", "10.251.11.0/24,fd00:10:251:11::/64", "--cluster-cidr", "10.251.0.0/16,fd00:10:251::/56"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let node_path = root.join("etc/ebpf-cni/node.json");
    let mut node_file: Value = serde_json::from_str(&fs::read_to_string(&node_path).unwrap()).unwrap();
    assert_eq!(
        (node_file["nodeIP"].as_str(), node_file["nodeIPv6"].as_str()),
        (Some(NODE1_UPLINK_IP), Some(NODE1_UPLINK_IPV6))
    );
    // The installed node file and conflist, with the state redirected into the testbed.
    node_file["bpffsRoot"] = json!(tb.bpffs_root());
    node_file["ipamDataDir"] = json!(tb.data_dir());
    let node_conf = tb.data_dir().with_file_name("node.json");
    fs::write(&node_conf, node_file.to_string()).unwrap();
    let list = conflist(&root);
    let mut conf = list["plugins"][0].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    let env = [("EBPF_CNI_NODE_CONF", node_conf.to_str().unwrap())];
    let add = |tb: &Testbed, pod: usize| tb.cni_env("ADD", pod, &conf, &tb.pods[pod].netns_path(), &env).unwrap();
    let first = tb.new_pod().unwrap();
    let out = add(tb, first);
    assert!(out.success, "{} {}", out.stdout, out.stderr);
    let first_ns = tb.pods[first].netns.name.clone();
    assert!(run_in(&first_ns, "ping", &["-6", "-c", "1", "-W", "2", EXT_SERVER_V6]).is_ok(), "IPv6 to the outside");

    // The uplink is renumbered: its IPv6 address is another one from now on.
    run_in(&tb.node.name, "ip", &["-6", "addr", "add", "fd00:192:0:2::9/64", "dev", "uplink0", "nodad"]).unwrap();
    run_in(&tb.node.name, "ip", &["-6", "addr", "del", &format!("{NODE1_UPLINK_IPV6}/64"), "dev", "uplink0"]).unwrap();
    let second = tb.new_pod().unwrap();
    let out = add(tb, second);
    assert!(out.success, "ADD after the uplink was renumbered: {} {}", out.stdout, out.stderr);
    for pod in [first, second] {
        let out = tb.cni_env("DEL", pod, &conf, &tb.pods[pod].netns_path(), &env).unwrap();
        assert!(out.success, "{} {}", out.stdout, out.stderr);
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
