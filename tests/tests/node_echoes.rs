//! Issue 24, item 10b: masquerade's echo identifiers against the node's own pings, with crafted
//! frames through the pinned programs of a live node whose `masqPortRange` is 100 ports.
//! - A node ping that starts while a pod's echo flow holds its identifier towards the same
//!   destination gets its replies: before, they were translated to the pod.
//! - A pod's new echo flows never take an identifier the node's ping to that destination uses.
use std::net::Ipv4Addr;

use ebpf_cni_tests::{
    Attached, Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed,
    frames::{ethernet, ipv4, with_checksums},
    prog_run::{TC_ACT_UNSPEC, run},
};
use serde_json::json;

const ETH_IPV4: u16 = 0x0800;
const ICMP: u8 = 1;
const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;
const PORT_MIN: u16 = 20_000;
const PORT_MAX: u16 = 20_099;

fn echo(kind: u8, id: u16) -> Vec<u8> {
    [&[kind, 0, 0, 0][..], &id.to_be_bytes(), &[0, 1], b"ping"].concat()
}

/// An echo request from `src` to `dst` through `to_uplink`; the identifier it leaves with.
fn request_out(tb: &Testbed, src: Ipv4Addr, dst: Ipv4Addr, id: u16) -> u16 {
    let frame =
        with_checksums([ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(src, dst, ICMP, &echo(ECHO_REQUEST, id))].concat());
    let (verdict, out) = run(tb, "to_uplink", "uplink0", frame);
    assert_eq!(verdict, TC_ACT_UNSPEC, "an echo request from {src} was dropped");
    u16::from_be_bytes([out[38], out[39]])
}

/// An echo reply from `src` to the node through `from_uplink`; the address it goes on to.
fn reply_in(tb: &Testbed, src: Ipv4Addr, node: Ipv4Addr, id: u16) -> Ipv4Addr {
    let frame =
        with_checksums([ethernet([4; 6], [2; 6], ETH_IPV4), ipv4(src, node, ICMP, &echo(ECHO_REPLY, id))].concat());
    let (verdict, out) = run(tb, "from_uplink", "uplink0", frame);
    assert_eq!(verdict, TC_ACT_UNSPEC);
    Ipv4Addr::new(out[30], out[31], out[32], out[33])
}

#[test]
fn pods_echo_identifiers_leave_the_nodes_own_pings_alone() {
    let (cidr, subnets) = ("10.207.0.0/16", ["10.207.1.0/24", "10.207.2.0/24"]);
    let Some(mut c) = Cluster::for_test("pods_echo_identifiers_leave_the_nodes_own_pings_alone", "echo", cidr, subnets)
    else {
        return;
    };
    c.nodes[0].extra.insert("masqPortRange".into(), json!(format!("{PORT_MIN}-{PORT_MAX}")));
    let tb = &mut c.nodes[0];
    let [a]: [Attached; 1] = tb.add_attachments(1).unwrap().try_into().unwrap();
    let (ext, node): (Ipv4Addr, Ipv4Addr) = (EXT_SERVER.parse().unwrap(), NODE1_UPLINK_IP.parse().unwrap());

    // a pings ext first: its flow holds identifier `held`, and its replies reach it.
    let held = request_out(tb, a.ip, ext, 7);
    assert!((PORT_MIN..=PORT_MAX).contains(&held));
    assert_eq!(reply_in(tb, ext, node, held), a.ip, "a's echo reply");
    // Then the node pings ext with that identifier: the replies are the node's from now on.
    assert_eq!(request_out(tb, node, ext, held), held, "the node's own request is not translated");
    assert_eq!(reply_in(tb, ext, node, held), node, "the node's ping's reply went to the pod");

    // The node pings ext with every even identifier of the range: a's new echo flows to ext get
    // odd ones only (before: any, and the node's replies went to a).
    for id in (PORT_MIN..=PORT_MAX).step_by(2) {
        request_out(tb, node, ext, id);
    }
    for pod_id in 100..125 {
        let id = request_out(tb, a.ip, ext, pod_id);
        assert!(id % 2 == 1, "a's echo flow {pod_id} took identifier {id}, which the node's ping uses");
        assert_eq!(reply_in(tb, ext, node, id), a.ip, "a's echo reply on {id}");
    }
    // Another destination is not the node's ping's: even identifiers are a's to take there.
    let other: Ipv4Addr = "198.51.100.77".parse().unwrap();
    let evens = (200..240).map(|pod_id| request_out(tb, a.ip, other, pod_id)).filter(|id| id % 2 == 0).count();
    assert!(evens > 0, "no even identifier towards a destination the node does not ping");
}
