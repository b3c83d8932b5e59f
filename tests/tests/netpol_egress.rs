//! NetworkPolicy's truth tables, egress (issue 27): upstream's default-deny-egress and deny-all,
//! egress by pod, namespace, both, ports, named ports (the peer's), endPort, ipBlock with except
//! (pod IPs), egress and ingress together (both ends must allow), and the union of policies.
use ebpf_cni_tests::{
    lan::Ipv6Plan,
    netpol::{
        Family::V4, NetpolCluster, Options, Peer, PodRef, Reachability, TCP_80, TCP_81, UDP_80, UDP_81, XA, ip_block,
        ns_peer, pod_peer, policy, port, xa_egress,
    },
};
use serde_json::json;

const OPTIONS: Options = Options {
    tag: "npeg",
    cluster_cidr: "10.151.0.0/16",
    subnets: ["10.151.1.0/24", "10.151.2.0/24"],
    ipv6: Ipv6Plan { cluster_cidr: "fd00:10:151::/56", subnets: ["fd00:10:151:1::/64", "fd00:10:151:2::/64"] },
    kube_proxy_replacement: false,
};

#[test]
fn netpol_egress() {
    let Some(mut c) = NetpolCluster::for_test("netpol_egress", OPTIONS) else { return };
    let all = || Reachability::all(true);

    c.case("no policy: everything connects", |c| {
        c.check(V4, &all());
    });
    c.case("default-deny-egress in x", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Egress"] }))]);
        c.check(V4, &all().deny_from(Peer::ns("x")));
    });
    c.case("default-deny-all (ingress and egress) in x", |c| {
        c.apply(vec![policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress", "Egress"] }))]);
        c.check(V4, &all().deny_from(Peer::ns("x")).deny_to(Peer::ns("x")));
    });
    c.case("allow-all egress beside deny-all egress (union)", |c| {
        c.apply(vec![
            policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Egress"] })),
            policy("x", "allow", json!({ "podSelector": {}, "policyTypes": ["Egress"], "egress": [{}] })),
        ]);
        c.check(V4, &all());
    });
    c.case("egress podSelector: x/a only to x/b", |c| {
        c.apply(vec![xa_egress("to-b", json!([{ "to": [pod_peer("b")] }]))]);
        c.check(V4, &all().deny_from(XA).allow(XA, Peer::pod("x", "b")));
    });
    c.case("egress namespaceSelector: x/a only to namespace y", |c| {
        c.apply(vec![xa_egress("to-y", json!([{ "to": [ns_peer("y")] }]))]);
        c.check(V4, &all().deny_from(XA).allow(XA, Peer::ns("y")));
    });
    c.case("egress AND: x/a only to pod a of namespace y", |c| {
        let peer = json!({ "namespaceSelector": { "matchLabels": { "ns": "y" } }, "podSelector": { "matchLabels": { "pod": "a" } } });
        c.apply(vec![xa_egress("and", json!([{ "to": [peer] }]))]);
        c.check(V4, &all().deny_from(XA).allow(XA, Peer::pod("y", "a")));
    });
    c.case("egress OR: x/a to namespace z or to pod c of x", |c| {
        c.apply(vec![xa_egress("or", json!([{ "to": [ns_peer("z"), pod_peer("c")] }]))]);
        c.check(V4, &all().deny_from(XA).allow(XA, Peer::ns("z")).allow(XA, Peer::pod("x", "c")));
    });
    c.case("egress ports: x/a anywhere on TCP 80 only", |c| {
        c.apply(vec![xa_egress("tcp80", json!([{ "ports": [port(TCP_80)] }]))]);
        c.check(V4, &all().deny_from(XA).expect_on(XA, Peer::ANY, &[TCP_80], true));
    });
    c.case("egress ports: x/a to namespace y on UDP 81", |c| {
        c.apply(vec![xa_egress("udp81", json!([{ "to": [ns_peer("y")], "ports": [port(UDP_81)] }]))]);
        c.check(V4, &all().deny_from(XA).expect_on(XA, Peer::ns("y"), &[UDP_81], true));
    });
    c.case("egress named port: serve-80-udp (the peers' own port)", |c| {
        c.apply(vec![xa_egress("named", json!([{ "ports": [{ "protocol": "UDP", "port": "serve-80-udp" }] }]))]);
        c.check(V4, &all().deny_from(XA).expect_on(XA, Peer::ANY, &[UDP_80], true));
    });
    c.case("egress endPort: TCP 60-80 to namespace z", |c| {
        c.apply(vec![xa_egress(
            "range",
            json!([{ "to": [ns_peer("z")], "ports": [{ "protocol": "TCP", "port": 60, "endPort": 80 }] }]),
        )]);
        c.check(V4, &all().deny_from(XA).expect_on(XA, Peer::ns("z"), &[TCP_80], true));
    });
    c.case("egress ipBlock: x/a only to y/b's /32", |c| {
        let yb = c.pods[&PodRef::new("y", "b")].ip(V4);
        c.apply(vec![xa_egress("cidr", json!([{ "to": [ip_block(&format!("{yb}/32"), &[])] }]))]);
        c.check(V4, &all().deny_from(XA).allow(XA, Peer::pod("y", "b")));
    });
    c.case("egress ipBlock with except: x/a to the cluster but y/b", |c| {
        let yb = c.pods[&PodRef::new("y", "b")].ip(V4);
        c.apply(vec![xa_egress("except", json!([{ "to": [ip_block(OPTIONS.cluster_cidr, &[format!("{yb}/32")])] }]))]);
        c.check(V4, &all().expect(XA, Peer::pod("y", "b"), false));
    });
    c.case("egress ipBlock 0.0.0.0/0 except node 1's pod subnet", |c| {
        // Node 1 has x/a, x/c, y/b, z/a and z/c (pods alternate between the nodes).
        c.apply(vec![xa_egress(
            "world",
            json!([{ "to": [ip_block("0.0.0.0/0", &[OPTIONS.subnets[0].to_string()])] }]),
        )]);
        let mut want = all();
        for (ns, pod) in [("x", "c"), ("y", "b"), ("z", "a"), ("z", "c")] {
            want = want.expect(XA, Peer::pod(ns, pod), false);
        }
        c.check(V4, &want);
    });
    c.case("two egress policies on x/a: the union", |c| {
        c.apply(vec![
            xa_egress("to-y", json!([{ "to": [ns_peer("y")] }])),
            xa_egress("to-zc-81", json!([{ "to": [{ "namespaceSelector": {}, "podSelector": { "matchLabels": { "pod": "c" } } }], "ports": [port(TCP_81)] }])),
        ]);
        let want = all()
            .deny_from(XA)
            .allow(XA, Peer::ns("y"))
            .expect_on(XA, Peer::named("c"), &[TCP_81], true);
        c.check(V4, &want);
    });
    c.case("egress and ingress together on x/a: only with x/b, both ways", |c| {
        c.apply(vec![policy(
            "x",
            "b-only",
            json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{ "from": [pod_peer("b")] }], "egress": [{ "to": [pod_peer("b")] }] }),
        )]);
        let b = Peer::pod("x", "b");
        c.check(V4, &all().deny_from(XA).deny_to(XA).allow(XA, b).allow(b, XA));
    });
    c.case("egress allowed but the server's ingress denies: denied", |c| {
        c.apply(vec![
            xa_egress("to-y", json!([{ "to": [ns_peer("y")] }])),
            policy("y", "from-z", json!({ "podSelector": {}, "ingress": [{ "from": [ns_peer("z")] }] })),
        ]);
        let want =
            all().deny_from(XA).allow(XA, Peer::ns("y")).deny_to(Peer::ns("y")).allow_from_ns("z", Peer::ns("y"));
        c.check(V4, &want);
    });
    c.case("deny egress in x and ingress in y: y → x still connects (replies are stateful)", |c| {
        c.apply(vec![
            policy("x", "deny-out", json!({ "podSelector": {}, "policyTypes": ["Egress"] })),
            policy("y", "deny-in", json!({ "podSelector": {}, "policyTypes": ["Ingress"] })),
        ]);
        c.check(V4, &all().deny_from(Peer::ns("x")).deny_to(Peer::ns("y")));
    });
    c.case("egress to UDP only: TCP denied on the same ports", |c| {
        c.apply(vec![xa_egress("udp", json!([{ "ports": [{ "protocol": "UDP" }] }]))]);
        c.check(V4, &all().deny_from(XA).expect_on(XA, Peer::ANY, &[UDP_80, UDP_81], true));
    });
    c.finish();
}
