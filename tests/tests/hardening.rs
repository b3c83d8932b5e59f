//! Hostile input, as an attacker would try it: a pod's packet to the node's loopback services,
//! the node's own namespace passed as a pod's, and a `logFile` that is a symlink or a FIFO.
//! Each is refused (or dropped and counted) and leaves nothing behind.
use std::{net::UdpSocket, os::unix::fs::symlink, time::Duration};

use ebpf_cni_tests::{
    Testbed,
    frames::{self, ethernet},
    run, run_in,
    traffic::{PacketSocket, in_netns},
};
use ebpf_common::DropReason;
use serde_json::json;

/// kube-proxy sets `route_localnet=1` (NodePorts on localhost); the kernel then routes a pod's
/// packet to 127.0.0.1 to the node's loopback services unless the datapath drops it.
#[test]
fn a_pods_packets_to_the_nodes_loopback_are_dropped() {
    let test = "a_pods_packets_to_the_nodes_loopback_are_dropped";
    let Some(mut tb) = Testbed::for_test(test, "lo", "10.219.0.0/24") else { return };
    run_in(&tb.node.name, "sysctl", &["-qw", "net.ipv4.conf.all.route_localnet=1"]).unwrap();
    let node_service = in_netns(&tb.node.name, || {
        let socket = UdpSocket::bind("127.0.0.1:4000")?;
        socket.set_read_timeout(Some(Duration::from_millis(500)))?;
        Ok(socket)
    })
    .unwrap();
    let pod = tb.new_pod().unwrap();
    let a = tb.add_attachment(pod).unwrap();
    let sock = PacketSocket::open(&tb.pods[pod].netns.name, "eth0").unwrap();
    let before = tb.drops(DropReason::Loopback).unwrap();
    let datagram = frames::ipv4_udp(a.ip, "127.0.0.1".parse().unwrap(), b"for the node only");
    sock.send(&frames::with_checksums([ethernet(a.host_mac, a.pod_mac, 0x0800), datagram].concat())).unwrap();
    assert!(node_service.recv(&mut [0u8; 64]).is_err(), "the node's loopback service received the pod's datagram");
    assert_eq!(tb.drops(DropReason::Loopback).unwrap(), before + 1, "not counted as loopback");
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// The node's namespace as `CNI_NETNS` would put the pod's interface and default route into the
/// node itself: code 4, and the node is left as it was.
#[test]
fn the_nodes_own_namespace_is_refused_as_a_pods() {
    let test = "the_nodes_own_namespace_is_refused_as_a_pods";
    let Some(mut tb) = Testbed::for_test(test, "ownns", "10.218.0.0/24") else { return };
    let pod = tb.new_pod().unwrap();
    let routes = || run_in(&tb.node.name, "ip", &["-o", "route"]).map(|o| o.stdout).unwrap();
    let (links_before, routes_before) = (tb.host_veths().unwrap(), routes());
    let node_ns = format!("/run/netns/{}", tb.node.name);
    let out = tb.cni_with_netns("ADD", pod, &tb.conf("1.1.0"), &node_ns).unwrap();
    assert!(!out.success, "ADD into the node's own namespace succeeded: {}", out.stdout);
    assert_eq!(out.code(), Some(4), "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap_or_default().contains("node's own network namespace"), "{}", out.stdout);
    assert_eq!((tb.host_veths().unwrap(), routes()), (links_before, routes_before), "the node changed");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// `logFile` pointing at a symlink (to a file the plugin must not write through) or at a FIFO
/// (which would block the plugin until a reader came): not used, reported on stderr; the verbs
/// work and log to stderr.
#[test]
fn a_log_file_that_is_a_symlink_or_a_fifo_is_not_used() {
    let test = "a_log_file_that_is_a_symlink_or_a_fifo_is_not_used";
    let Some(mut tb) = Testbed::for_test(test, "logf", "10.217.0.0/24") else { return };
    let dir = tb.data_dir().join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("somebody-elses-file");
    std::fs::write(&target, "untouched\n").unwrap();
    let link = dir.join("link.log");
    symlink(&target, &link).unwrap();
    let fifo = dir.join("fifo.log");
    run("mkfifo", &[fifo.to_str().unwrap()]).unwrap();
    for (path, what) in [(&link, "symlink"), (&fifo, "FIFO")] {
        tb.extra.insert("logFile".into(), json!(path));
        tb.extra.insert("logLevel".into(), json!("info"));
        let pod = tb.new_pod().unwrap();
        let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
        assert!(out.success, "{what}: ADD failed: {} {}", out.stdout, out.stderr);
        assert!(out.elapsed < Duration::from_secs(5), "{what}: ADD took {:?}", out.elapsed);
        assert!(out.stderr.contains("cannot use logFile"), "{what}: not reported: {}", out.stderr);
        tb.del(pod).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched\n", "written through the symlink");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
