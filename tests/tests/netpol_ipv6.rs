//! NetworkPolicy's truth tables over IPv6 (issue 27), on the same dual-stack pods: a subset of
//! the ingress and egress cases probed over each pod's IPv6 address, ipBlock with IPv6 CIDRs and
//! except, and an IPv6 block that must not admit the same pods over IPv4.
use ebpf_cni_tests::{
    lan::Ipv6Plan,
    netpol::{
        Family::{V4, V6},
        NetpolCluster, Options, Peer, PodRef, Reachability, TCP_81, UDP_80, XA, ip_block, ns_peer, pod_peer, policy,
        port, xa_egress, xa_ingress,
    },
};
use serde_json::json;

const OPTIONS: Options = Options {
    tag: "np6",
    cluster_cidr: "10.154.0.0/16",
    subnets: ["10.154.1.0/24", "10.154.2.0/24"],
    ipv6: Ipv6Plan { cluster_cidr: "fd00:10:154::/56", subnets: ["fd00:10:154:1::/64", "fd00:10:154:2::/64"] },
    kube_proxy_replacement: false,
};

#[test]
fn netpol_ipv6() {
    let Some(mut c) = NetpolCluster::for_test("netpol_ipv6", OPTIONS) else { return };
    let all = || Reachability::all(true);

    c.case("no policy: everything connects over IPv6", |c| {
        c.check(V6, &all());
    });
    c.case("default-deny-ingress in x, both families", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] }))]);
        c.check(V6, &all().deny_to(Peer::ns("x")));
        c.check(V4, &all().deny_to(Peer::ns("x")));
    });
    c.case("podSelector OR namespaceSelector into x/a", |c| {
        c.apply(vec![xa_ingress("or", json!([{ "from": [ns_peer("z"), pod_peer("c")] }]))]);
        c.check(V6, &all().deny_to(XA).allow_from_ns("z", XA).allow(Peer::pod("x", "c"), XA));
    });
    c.case("ports and named ports into x/a", |c| {
        c.apply(vec![xa_ingress(
            "ports",
            json!([{ "from": [ns_peer("y")], "ports": [port(TCP_81), { "protocol": "UDP", "port": "serve-80-udp" }] }]),
        )]);
        c.check(V6, &all().deny_to(XA).expect_on(Peer::ns("y"), XA, &[TCP_81, UDP_80], true));
    });
    c.case("ipBlock: the IPv6 cluster range except y/b's /128", |c| {
        let yb = c.pods[&PodRef::new("y", "b")].ip(V6);
        c.apply(vec![xa_ingress(
            "cidr6",
            json!([{ "from": [ip_block(OPTIONS.ipv6.cluster_cidr, &[format!("{yb}/128")])] }]),
        )]);
        c.check(V6, &all().expect(Peer::pod("y", "b"), XA, false));
        // The block names IPv6 addresses only: over IPv4 nobody is admitted.
        c.check(V4, &all().deny_to(XA));
    });
    c.case("ipBlock: node 2's IPv6 pod subnet", |c| {
        c.apply(vec![xa_ingress("subnet6", json!([{ "from": [ip_block(OPTIONS.ipv6.subnets[1], &[])] }]))]);
        let mut want = all().deny_to(XA);
        for (ns, pod) in [("x", "b"), ("y", "a"), ("y", "c"), ("z", "b")] {
            want = want.allow(Peer::pod(ns, pod), XA);
        }
        c.check(V6, &want);
    });
    c.case("default-deny-egress in x", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Egress"] }))]);
        c.check(V6, &all().deny_from(Peer::ns("x")));
    });
    c.case("egress from x/a to namespace y on UDP 80, and to ::/0 except node 1's subnet on TCP 81", |c| {
        c.apply(vec![xa_egress(
            "out",
            json!([{ "to": [ns_peer("y")], "ports": [port(UDP_80)] },
                   { "to": [ip_block("::/0", &[OPTIONS.ipv6.subnets[0].to_string()])], "ports": [port(TCP_81)] }]),
        )]);
        let node2 = [("x", "b"), ("y", "a"), ("y", "c"), ("z", "b")];
        let mut want = all().deny_from(XA).expect_on(XA, Peer::ns("y"), &[UDP_80], true);
        for (ns, pod) in node2 {
            want = want.expect_on(XA, Peer::pod(ns, pod), &[TCP_81], true);
        }
        c.check(V6, &want);
    });
    c.finish();
}
