//! Three pods on one node: every pod reaches every other and the node reaches every pod; a
//! spoofed source is dropped and counted; later ADDs reuse the pinned program.
use ebpf_cni_tests::{NODE_IP, TEST_MTU, Testbed, run_in};
use ebpf_common::{DropReason, ForwardPath};

#[test]
fn three_pods_reach_each_other_and_the_node() {
    let Some(mut tb) = Testbed::for_test("three_pods_reach_each_other_and_the_node", "conn", "10.250.0.0/24") else {
        return;
    };
    let mut ips = Vec::new();
    let mut program = None;
    for _ in 0..3 {
        let pod = tb.new_pod().unwrap();
        ips.push(tb.add(pod).unwrap());
        let id = tb.program_id().unwrap();
        assert_eq!(*program.get_or_insert(id), id, "a later ADD loaded the program again");
    }
    for (index, pod) in tb.pods.iter().enumerate() {
        let link = run_in(&pod.netns.name, "ip", &["-o", "link", "show", "eth0"]).unwrap();
        let link = String::from_utf8_lossy(&link.stdout).into_owned();
        assert!(link.contains(&format!("mtu {TEST_MTU} ")), "pod {index}: MTU from the config not applied: {link}");
    }
    for (from, pod) in tb.pods.iter().enumerate() {
        for (to, ip) in ips.iter().enumerate() {
            if from != to {
                let before = tb.forwarded(ForwardPath::PodToPod).unwrap();
                assert!(tb.ping(&pod.netns.name, ip), "pod {from} cannot reach pod {to} ({ip})");
                // The request and the reply, each straight into the other pod (IPv6 router
                // solicitations of the pods are drops, not forwards).
                assert_eq!(tb.forwarded(ForwardPath::PodToPod).unwrap() - before, 2, "pod {from} → pod {to}");
            }
        }
        let before = tb.forwarded(ForwardPath::ToStack).unwrap();
        assert!(tb.ping(&pod.netns.name, NODE_IP), "pod {from} cannot reach the node");
        assert!(tb.forwarded(ForwardPath::ToStack).unwrap() > before, "pod {from} → node: through the stack");
        assert!(tb.ping(&tb.node.name, &ips[from]), "node cannot reach pod {from}");
    }
}

#[test]
fn spoofed_source_is_dropped_and_counted() {
    let Some(mut tb) = Testbed::for_test("spoofed_source_is_dropped_and_counted", "spoof", "10.251.0.0/24") else {
        return;
    };
    let (a, b) = (tb.new_pod().unwrap(), tb.new_pod().unwrap());
    tb.add(a).unwrap();
    let ip_b = tb.add(b).unwrap();
    let ns_a = tb.pods[a].netns.name.clone();
    assert!(tb.ping(&ns_a, &ip_b), "legitimate traffic must pass first");
    let before = tb.drops(DropReason::SpoofedSource).unwrap();
    // The pod claims an address IPAM never gave it.
    run_in(&ns_a, "ip", &["addr", "add", "10.251.0.200/32", "dev", "eth0"]).unwrap();
    let spoofed = run_in(&ns_a, "ping", &["-c", "2", "-W", "1", "-I", "10.251.0.200", &ip_b]);
    assert!(spoofed.is_err(), "a ping from a spoofed source got an answer");
    let after = tb.drops(DropReason::SpoofedSource).unwrap();
    assert!(after >= before + 2, "spoofed packets not counted: {before} -> {after}");
}
