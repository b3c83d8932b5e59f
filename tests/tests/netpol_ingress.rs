//! NetworkPolicy's truth tables, ingress (issue 27): upstream's deny, allow, selector,
//! matchExpressions, AND/OR peers, ports, named ports, endPort, protocol, ipBlock and union
//! cases, each probed over the whole matrix (9 pods × 8 peers × TCP/UDP 80/81) on two nodes.
use ebpf_cni_tests::{
    lan::Ipv6Plan,
    netpol::{
        Family::V4, NetpolCluster, Options, Peer, PodRef, Reachability, TCP_80, TCP_81, UDP_80, UDP_81, XA, ip_block,
        ns_peer, pod_peer, policy, port, port_range, xa_ingress,
    },
};
use serde_json::json;

const OPTIONS: Options = Options {
    tag: "npin",
    cluster_cidr: "10.150.0.0/16",
    subnets: ["10.150.1.0/24", "10.150.2.0/24"],
    ipv6: Ipv6Plan { cluster_cidr: "fd00:10:150::/56", subnets: ["fd00:10:150:1::/64", "fd00:10:150:2::/64"] },
    kube_proxy_replacement: false,
};

#[test]
fn netpol_ingress() {
    let Some(mut c) = NetpolCluster::for_test("netpol_ingress", OPTIONS) else { return };
    let all = || Reachability::all(true);

    c.case("no policy: everything connects", |c| {
        c.check(V4, &all());
    });
    c.case("default-deny-ingress in x", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] }))]);
        c.check(V4, &all().deny_to(Peer::ns("x")));
    });
    c.case("default-deny-ingress with policyTypes left out (ingress implied)", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {} }))]);
        c.check(V4, &all().deny_to(Peer::ns("x")));
    });
    c.case("allow-all ingress beside deny-all (union)", |c| {
        c.apply(vec![
            policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] })),
            policy("x", "allow", json!({ "podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}] })),
        ]);
        c.check(V4, &all());
    });
    c.case("allow ingress to one target (x/a) under deny-all in x", |c| {
        c.apply(vec![
            policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] })),
            xa_ingress("allow-a", json!([{}])),
        ]);
        c.check(V4, &all().deny_to(Peer::ns("x")).all_ingress(XA, true));
    });
    c.case("podSelector: x/a only from x/b", |c| {
        c.apply(vec![xa_ingress("from-b", json!([{ "from": [pod_peer("b")] }]))]);
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("x", "b"), XA));
    });
    c.case("podSelector {}: x from its own namespace only", |c| {
        c.apply(vec![policy(
            "x",
            "same-ns",
            json!({ "podSelector": {}, "ingress": [{ "from": [{ "podSelector": {} }] }] }),
        )]);
        c.check(V4, &all().deny_to(Peer::ns("x")).allow_from_ns("x", Peer::ns("x")));
    });
    c.case("namespaceSelector {}: x/a from every namespace", |c| {
        c.apply(vec![xa_ingress("all-ns", json!([{ "from": [{ "namespaceSelector": {} }] }]))]);
        c.check(V4, &all());
    });
    c.case("namespaceSelector: x/a only from y", |c| {
        c.apply(vec![xa_ingress("from-y", json!([{ "from": [ns_peer("y")] }]))]);
        c.check(V4, &all().deny_to(XA).allow_from_ns("y", XA));
    });
    c.case("podSelector matchExpressions: x/a from pod In [b]", |c| {
        let peer =
            json!({ "podSelector": { "matchExpressions": [{ "key": "pod", "operator": "In", "values": ["b"] }] } });
        c.apply(vec![xa_ingress("expr", json!([{ "from": [peer] }]))]);
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("x", "b"), XA));
    });
    c.case("namespaceSelector matchExpressions: x/a from ns NotIn [x, z]", |c| {
        let peer = json!({ "namespaceSelector": { "matchExpressions": [{ "key": "ns", "operator": "NotIn", "values": ["x", "z"] }] } });
        c.apply(vec![xa_ingress("expr", json!([{ "from": [peer] }]))]);
        c.check(V4, &all().deny_to(XA).allow_from_ns("y", XA));
    });
    c.case("matchExpressions Exists / DoesNotExist", |c| {
        let exists = json!({ "namespaceSelector": { "matchExpressions": [{ "key": "ns", "operator": "Exists" }] },
                             "podSelector": { "matchExpressions": [{ "key": "nothere", "operator": "DoesNotExist" },
                                                                   { "key": "pod", "operator": "NotIn", "values": ["c"] }] } });
        c.apply(vec![xa_ingress("expr", json!([{ "from": [exists] }]))]);
        c.check(V4, &all().deny_to(XA).expect(Peer::named("a"), XA, true).expect(Peer::named("b"), XA, true));
    });
    c.case("OR: x/a from namespace y or from pod b of x (two peers)", |c| {
        c.apply(vec![xa_ingress("or", json!([{ "from": [ns_peer("y"), pod_peer("b")] }]))]);
        c.check(V4, &all().deny_to(XA).allow_from_ns("y", XA).allow(Peer::pod("x", "b"), XA));
    });
    c.case("AND: x/a only from pod b of namespace y (one peer)", |c| {
        let peer = json!({ "namespaceSelector": { "matchLabels": { "ns": "y" } }, "podSelector": { "matchLabels": { "pod": "b" } } });
        c.apply(vec![xa_ingress("and", json!([{ "from": [peer] }]))]);
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("y", "b"), XA));
    });
    c.case("AND with expressions: ns In [y, z] and pod In [b, c]", |c| {
        let peer = json!({
            "namespaceSelector": { "matchExpressions": [{ "key": "ns", "operator": "In", "values": ["y", "z"] }] },
            "podSelector": { "matchExpressions": [{ "key": "pod", "operator": "In", "values": ["b", "c"] }] } });
        c.apply(vec![xa_ingress("and", json!([{ "from": [peer] }]))]);
        let mut want = all().deny_to(XA);
        for (ns, pod) in [("y", "b"), ("y", "c"), ("z", "b"), ("z", "c")] {
            want = want.allow(Peer::pod(ns, pod), XA);
        }
        c.check(V4, &want);
    });
    c.case("ports: x/a from y on TCP 81 only", |c| {
        c.apply(vec![xa_ingress("port", json!([{ "from": [ns_peer("y")], "ports": [port(TCP_81)] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ns("y"), XA, &[TCP_81], true));
    });
    c.case("ports: UDP 80 only, from anywhere (protocol matters)", |c| {
        c.apply(vec![xa_ingress("udp", json!([{ "ports": [port(UDP_80)] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[UDP_80], true));
    });
    c.case("ports: protocol TCP without a port (every TCP port)", |c| {
        c.apply(vec![xa_ingress("tcp", json!([{ "ports": [{ "protocol": "TCP" }] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[TCP_80, TCP_81], true));
    });
    c.case("ports: a port without protocol means TCP", |c| {
        c.apply(vec![xa_ingress("tcp80", json!([{ "ports": [{ "port": 80 }] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[TCP_80], true));
    });
    c.case("named port: x/a on serve-81-tcp from anywhere", |c| {
        c.apply(vec![xa_ingress("named", json!([{ "ports": [{ "protocol": "TCP", "port": "serve-81-tcp" }] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[TCP_81], true));
    });
    c.case("named port: serve-80-udp from namespace y", |c| {
        c.apply(vec![xa_ingress(
            "named",
            json!([{ "from": [ns_peer("y")], "ports": [{ "protocol": "UDP", "port": "serve-80-udp" }] }]),
        )]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ns("y"), XA, &[UDP_80], true));
    });
    c.case("named port of the wrong protocol matches nothing", |c| {
        c.apply(vec![xa_ingress("named", json!([{ "ports": [{ "protocol": "UDP", "port": "serve-81-tcp" }] }]))]);
        c.check(V4, &all().deny_to(XA));
    });
    c.case("endPort: TCP 81-90 (80 out of the range)", |c| {
        c.apply(vec![xa_ingress("range", json!([{ "ports": [port_range(TCP_81, 90)] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[TCP_81], true));
    });
    c.case("endPort: UDP 70-80 (81 out of the range)", |c| {
        c.apply(vec![xa_ingress("range", json!([{ "ports": [{ "protocol": "UDP", "port": 70, "endPort": 80 }] }]))]);
        c.check(V4, &all().deny_to(XA).expect_on(Peer::ANY, XA, &[UDP_80], true));
    });
    c.case("two policies selecting x/a: the union of their rules", |c| {
        c.apply(vec![
            xa_ingress("from-b-80", json!([{ "from": [pod_peer("b")], "ports": [port(TCP_80)] }])),
            xa_ingress("from-y-81", json!([{ "from": [ns_peer("y")], "ports": [port(UDP_81)] }])),
        ]);
        let want = all().deny_to(XA).expect_on(Peer::pod("x", "b"), XA, &[TCP_80], true).expect_on(
            Peer::ns("y"),
            XA,
            &[UDP_81],
            true,
        );
        c.check(V4, &want);
    });
    c.case("policies in two namespaces isolate only their own", |c| {
        c.apply(vec![
            policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] })),
            policy(
                "z",
                "from-y",
                json!({ "podSelector": { "matchLabels": { "pod": "c" } }, "ingress": [{ "from": [ns_peer("y")] }] }),
            ),
        ]);
        c.check(V4, &all().deny_to(Peer::ns("x")).deny_to(Peer::pod("z", "c")).allow_from_ns("y", Peer::pod("z", "c")));
    });
    c.case("ipBlock with except (pod IPs): x/a from the cluster but y/b", |c| {
        let yb = c.pods[&PodRef::new("y", "b")].ip(V4);
        c.apply(vec![xa_ingress("cidr", json!([{ "from": [ip_block(OPTIONS.cluster_cidr, &[format!("{yb}/32")])] }]))]);
        c.check(V4, &all().expect(Peer::pod("y", "b"), XA, false));
    });
    c.case("ipBlock of one pod's /32: x/a only from z/c", |c| {
        let zc = c.pods[&PodRef::new("z", "c")].ip(V4);
        c.apply(vec![xa_ingress("cidr", json!([{ "from": [ip_block(&format!("{zc}/32"), &[])] }]))]);
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("z", "c"), XA));
    });
    c.case("ipBlock of node 2's pod subnet except one pod", |c| {
        // x/b, y/a, y/c and z/b are on node 2 (pods alternate between the nodes).
        let ya = c.pods[&PodRef::new("y", "a")].ip(V4);
        c.apply(vec![xa_ingress("subnet", json!([{ "from": [ip_block(OPTIONS.subnets[1], &[format!("{ya}/32")])] }]))]);
        let mut want = all().deny_to(XA);
        for (ns, pod) in [("x", "b"), ("y", "c"), ("z", "b")] {
            want = want.allow(Peer::pod(ns, pod), XA);
        }
        c.check(V4, &want);
    });
    c.finish();
}
