//! An upgrade while pods run (design.md, "Upgrades"): a node whose pods the previous release
//! (`EBPF_CNI_BASE_BIN`, built by `cargo xtask test` from git history) added gets this build.
//! Its pods keep their traffic, a flow open across the upgrade included; new pods join them on
//! the datapath already loaded; once the old pods are gone, the next ADD loads this build's
//! layout, and nothing is left behind.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
};

use ebpf_cni_tests::{Cluster, EXT_SERVER, NODE1_UPLINK_IP, Plugin, require_privileges, traffic};

/// The previous release's binary, or `None` (then the test is skipped, except under CI).
fn base_plugin(test: &str) -> Option<Plugin> {
    match std::env::var_os("EBPF_CNI_BASE_BIN") {
        Some(path) => Some(Plugin { binary: PathBuf::from(path) }),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: EBPF_CNI_BASE_BIN is not set (`cargo xtask test` builds it) and CI=true forbids skipping")
        }
        None => {
            eprintln!("SKIPPED {test}: EBPF_CNI_BASE_BIN is not set (`cargo xtask test` builds it)");
            None
        }
    }
}

#[test]
fn pods_of_the_previous_release_keep_working_across_an_upgrade() {
    let test = "pods_of_the_previous_release_keep_working_across_an_upgrade";
    if !require_privileges(test) {
        return;
    }
    let Some(base) = base_plugin(test) else { return };
    let new = Plugin::from_env().unwrap();
    let mut c = Cluster::with_plugin("upg", "10.251.0.0/16", ["10.251.1.0/24", "10.251.2.0/24"], base).unwrap();
    let tb = &mut c.nodes[0];
    let (old_a, old_b, fresh) = (tb.new_pod().unwrap(), tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let ip_a = tb.add(old_a).unwrap();
    let ip_b = tb.add(old_b).unwrap();
    assert!(tb.pin_dir().join("v2/progs/from_pod").exists(), "the previous release pins layout v2");

    // A masqueraded flow opened before the upgrade.
    let server = traffic::udp_socket(&c.ext.name, SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 5353)).unwrap();
    let client = traffic::udp_socket(&tb.pods[old_a].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    client.connect(SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 5353)).unwrap();
    let exchange = || {
        client.send(b"ping").unwrap();
        let (from, _) = traffic::recv_udp(&server).unwrap();
        server.send_to(b"pong", from).unwrap();
        let mut buf = [0u8; 8];
        let n = client.recv(&mut buf).expect("the flow opened before the upgrade lost its replies");
        assert_eq!(&buf[..n], b"pong");
        from
    };
    let before = exchange();
    assert_eq!(before.ip().to_string(), NODE1_UPLINK_IP);

    // The upgrade: this build's binary from now on.
    tb.plugin = new;
    let ip_fresh = tb.add(fresh).unwrap();
    assert!(!tb.pin_dir().join("v3").exists(), "a second datapath loaded beside the running one");
    assert_eq!(exchange(), before, "the open flow changed its masquerade port");
    let ns = |pod: usize| tb.pods[pod].netns.name.clone();
    for (from, to, what) in [
        (ns(fresh), ip_a.as_str(), "new pod → old pod"),
        (ns(old_b), ip_fresh.as_str(), "old pod → new pod"),
        (ns(old_a), ip_b.as_str(), "old pod → old pod"),
        (ns(fresh), EXT_SERVER, "new pod → outside"),
        (ns(old_b), EXT_SERVER, "old pod → outside"),
    ] {
        assert!(tb.ping(&from, to), "{what}");
    }
    let settings = std::process::Command::new(&tb.plugin.binary)
        .args(["inspect", "settings", "-o", "json", "--bpffs-root"])
        .arg(tb.bpffs_root())
        .args(["--netns", &format!("/run/netns/{}", tb.node.name)])
        .output()
        .unwrap();
    assert!(settings.status.success(), "inspect reads the previous layout's pins: {settings:?}");

    // The old pods go (the node drains them); the network's next ADD loads this build's layout.
    for pod in [old_a, old_b, fresh] {
        tb.del(pod).unwrap();
    }
    assert!(!tb.pin_dir().join("v2").exists(), "the previous layout's pins outlived its last pod");
    let next = tb.new_pod().unwrap();
    tb.add(next).unwrap();
    assert!(tb.version_dir().join("progs/from_pod").exists(), "this build's layout was not loaded");
    let next_ns = tb.pods[next].netns.name.clone();
    assert!(tb.ping(&next_ns, EXT_SERVER), "a pod on this build's datapath → outside");
    tb.del(next).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
