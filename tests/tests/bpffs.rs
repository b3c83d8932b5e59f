//! A fresh node has no bpffs where the plugin pins: the plugin mounts it itself (STATUS and
//! ADD), and every verb works on it. Played in a mount namespace of the test's own, so that
//! the machine's mounts never change.
use ebpf_cni_tests::{MountNamespace, Testbed};
use serde_json::json;

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

fn fs_type(path: &std::path::Path) -> i64 {
    nix::sys::statfs::statfs(path).map(|s| s.filesystem_type().0).unwrap_or_default()
}

#[test]
fn a_node_without_bpffs_gets_one() {
    let Some(mut tb) = Testbed::for_test("a_node_without_bpffs_gets_one", "freshfs", "10.231.0.0/24") else {
        return;
    };
    // A plain directory where the node's bpffs would be (as /sys/fs/bpf on a fresh node).
    let mount_point = tb.data_dir().with_file_name("fresh-bpf");
    std::fs::create_dir_all(&mount_point).unwrap();
    tb.extra.insert("bpffsRoot".into(), json!(mount_point.join("ebpf-cni")));
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let mounts = MountNamespace::create().unwrap();
    tb.mount_ns = Some(mounts.path());
    let inside = mounts.inside(&mount_point);
    assert_ne!(fs_type(&inside), BPF_FS_MAGIC, "no bpffs yet");

    // A directory that holds something is never mounted over (a root of `/sys/fs/bpf` itself
    // on a fresh node would otherwise hide `/sys/fs`): STATUS says why ADD would fail.
    let busy = tb.data_dir().with_file_name("busy");
    std::fs::create_dir_all(busy.join("something")).unwrap();
    let mut hiding = tb.conf("1.1.0");
    hiding["bpffsRoot"] = json!(busy.join("ebpf-cni"));
    let out = tb.cni_raw(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")], &hiding.to_string()).unwrap();
    assert_eq!(out.code(), Some(50), "{}", out.stdout);
    assert!(out.stdout.contains("not empty"), "{}", out.stdout);
    assert_ne!(fs_type(&mounts.inside(&busy)), BPF_FS_MAGIC);

    let status = tb.cni_raw(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")], &tb.conf("1.1.0").to_string());
    assert!(status.unwrap().success, "STATUS mounts bpffs and reports ready");
    assert_eq!(fs_type(&inside), BPF_FS_MAGIC, "STATUS mounted bpffs");
    // Unmounted again, so that ADD meets the fresh node too.
    let umount = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", mounts.path().display()))
        .args(["umount", mount_point.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(umount.success());

    let first = tb.cni("ADD", a, &tb.conf("1.1.0")).unwrap();
    assert!(first.success, "first ADD: {} {}", first.stdout, first.stderr);
    assert_eq!(fs_type(&inside), BPF_FS_MAGIC, "ADD mounted bpffs");
    let pins = mount_point.join("ebpf-cni").join(&tb.network);
    let program = pins.join(format!("v{}/progs/from_pod", ebpf_common::PIN_LAYOUT_VERSION));
    assert!(mounts.inside(&program).exists(), "pinned on it");
    let ip_b = tb.add(b).unwrap();
    let mut check = tb.conf("1.1.0");
    check["prevResult"] = first.json();
    let out = tb.cni("CHECK", a, &check).unwrap();
    assert!(out.success, "CHECK: {} {}", out.stdout, out.stderr);
    assert!(tb.ping(&tb.pods[a].netns.name, &ip_b), "the pods reach each other");

    tb.del(a).unwrap();
    tb.del(b).unwrap();
    assert!(!mounts.inside(&pins).exists(), "pins removed");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    assert_ne!(fs_type(&mount_point), BPF_FS_MAGIC, "the test's own mount namespace never saw the mount");
}

/// The agent, started on a fresh node, mounts bpffs before the first pod arrives.
#[test]
fn the_agent_mounts_bpffs_at_start() {
    let Some(tb) = Testbed::for_test("the_agent_mounts_bpffs_at_start", "freshag", "10.231.1.0/24") else {
        return;
    };
    let mount_point = tb.data_dir().with_file_name("fresh-bpf");
    std::fs::create_dir_all(&mount_point).unwrap();
    let nodes = tb.data_dir().with_file_name("nodes.json");
    std::fs::write(&nodes, json!({ "items": [{ "metadata": { "name": "node-1" } }] }).to_string()).unwrap();
    let mounts = MountNamespace::create().unwrap();
    let out = std::process::Command::new("nsenter")
        .arg(format!("--mount={}", mounts.path().display()))
        .arg(format!("--net=/run/netns/{}", tb.node.name))
        .arg(&tb.plugin.binary)
        .args(["agent", "--once", "--node", "node-1", "--nodes-file", nodes.to_str().unwrap()])
        .arg("--bpffs-root")
        .arg(mount_point.join("ebpf-cni"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("mounted it on"), "the log says so: {stderr}");
    assert_eq!(fs_type(&mounts.inside(&mount_point)), BPF_FS_MAGIC);
    assert_ne!(fs_type(&mount_point), BPF_FS_MAGIC, "the test's own mount namespace never saw the mount");
}
