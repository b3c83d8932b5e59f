//! NetworkPolicy under change (issue 27): policies created, updated and deleted while traffic
//! runs (new connections follow within 1 s; a connection opened while its pod was isolated keeps
//! the verdict it was opened with, and one opened before the pod was isolated is judged again:
//! the documented rules), pod and namespace labels changed, a pod added after the
//! policy, and bad input (a selector matching nothing, a policy in an unknown namespace, a
//! policy of 10,000 rules): no crash, no wrong verdict.
use std::{
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    lan::Ipv6Plan,
    netpol::{
        Family::V4, NetpolCluster, Options, Peer, PodRef, Reachability, TCP_80, XA, ip_block, ns_peer, pod_peer, policy,
    },
    service_probe::ask,
    traffic::{in_netns, tcp_connect},
};
use serde_json::{Value, json};

const OPTIONS: Options = Options {
    tag: "npch",
    cluster_cidr: "10.152.0.0/16",
    subnets: ["10.152.1.0/24", "10.152.2.0/24"],
    ipv6: Ipv6Plan { cluster_cidr: "fd00:10:152::/56", subnets: ["fd00:10:152:1::/64", "fd00:10:152:2::/64"] },
    kube_proxy_replacement: false,
};

const A: PodRef = PodRef::new("x", "a");
const B: PodRef = PodRef::new("x", "b");
/// The 1 s the issue gives a change to reach new connections.
const WITHIN: Duration = Duration::from_secs(1);

fn deny_x() -> Value {
    policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] }))
}

/// A TCP connection and a connected UDP socket from `from` to `to`'s port 80, each answered once.
fn open_flows(c: &NetpolCluster, from: PodRef, to: PodRef) -> (TcpStream, UdpSocket) {
    let (netns, ip) = (c.pods[&from].pod.netns.clone(), c.pods[&to].pod.ip);
    let mut tcp = tcp_connect(&netns, 0, SocketAddr::new(ip.into(), 80)).expect("opening the long connection");
    assert_eq!(ask(&mut tcp).as_deref(), Ok(to.to_string().as_str()));
    let udp = in_netns(&netns, move || {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect(SocketAddr::new(ip.into(), 80))?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        Ok(s)
    })
    .unwrap();
    assert_eq!(udp_ask(&udp).as_deref(), Some(to.to_string().as_str()));
    (tcp, udp)
}

fn udp_ask(s: &UdpSocket) -> Option<String> {
    // A datagram may be lost on a busy machine: three tries.
    (0..3).find_map(|_| {
        s.send(b"q").ok()?;
        let mut buf = [0u8; 64];
        s.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    })
}

/// The open flows still carry traffic both ways.
fn still_open(tcp: &mut TcpStream, udp: &UdpSocket, to: PodRef) {
    let tcp = ask(tcp);
    let udp = udp_ask(udp);
    let want = to.to_string();
    println!("   the flows opened before: TCP {tcp:?}, UDP {udp:?}");
    assert!(
        tcp.as_deref() == Ok(want.as_str()) && udp.as_deref() == Some(want.as_str()),
        "an open flow was cut: TCP {tcp:?}, UDP {udp:?} (errno, time waited)"
    );
}

/// The open flows carry nothing any more: judged again once their pod became isolated, and denied.
fn now_cut(tcp: &mut TcpStream, udp: &UdpSocket) {
    let tcp = ask(tcp);
    let udp = udp_ask(udp);
    println!("   the flows opened before the pod was isolated: TCP {tcp:?}, UDP {udp:?}");
    assert!(tcp.is_err() && udp.is_none(), "a flow the new policy denies still passes: TCP {tcp:?}, UDP {udp:?}");
}

/// One probe's flip after the last change: within [`WITHIN`], or the case fails.
fn flips_within(c: &NetpolCluster, from: PodRef, to: PodRef, want: bool, what: &str) {
    let took = c.time_until(from, to, TCP_80, want, Duration::from_secs(5));
    println!("   {what}: {from} → {to} {} after {took:?}", if want { "connects" } else { "is denied" });
    assert!(took.is_some_and(|t| t <= WITHIN), "{what}: {from} → {to} took {took:?} (more than {WITHIN:?})");
}

/// Bad input gets a log line: each agent's log names `policy` (`ns/name`) within 2 s.
fn logged(c: &NetpolCluster, policy: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    for (node, agent) in c.agents.iter().enumerate() {
        loop {
            let log = agent.log();
            if let Some(line) = log.lines().find(|l| l.contains(policy)) {
                println!("   node {}: {}", node + 1, line.split_once(" ebpf-cni").map_or(line, |(_, rest)| rest));
                break;
            }
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            assert!(
                std::time::Instant::now() < deadline,
                "node {}'s agent logged nothing about {policy}; its last lines: {tail:#?}",
                node + 1
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn netpol_changes() {
    let Some(mut c) = NetpolCluster::for_test("netpol_changes", OPTIONS) else { return };
    let all = || Reachability::all(true);

    c.case("no policy: everything connects", |c| {
        c.check(V4, &all());
    });
    c.case("policy created while traffic runs, then deleted", |c| {
        // Opened while x/a was not isolated: no verdict was cached for them (a pod no policy
        // isolates pays no lookup), so the deny-all judges their next packets and drops them.
        let (mut tcp, udp) = open_flows(c, B, A);
        c.apply(vec![deny_x()]);
        flips_within(c, B, A, false, "created");
        c.check(V4, &all().deny_to(Peer::ns("x")));
        now_cut(&mut tcp, &udp);
        c.delete_policy("x/deny");
        flips_within(c, B, A, true, "deleted");
        c.check(V4, &all());
    });
    c.case("policy updated while traffic runs: from x/b, then from y", |c| {
        let from_b = |peer: Value| {
            policy(
                "x",
                "a-from",
                json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": [{ "from": [peer] }] }),
            )
        };
        c.apply(vec![from_b(pod_peer("b"))]);
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("x", "b"), XA));
        let (mut tcp, udp) = open_flows(c, B, A);
        c.put_policies(vec![from_b(ns_peer("y"))]);
        flips_within(c, B, A, false, "updated");
        c.check(V4, &all().deny_to(XA).allow_from_ns("y", XA));
        still_open(&mut tcp, &udp, A);
    });
    c.case("a second policy added, then the first deleted", |c| {
        c.apply(vec![deny_x()]);
        c.check(V4, &all().deny_to(Peer::ns("x")));
        c.put_policies(vec![policy(
            "x",
            "from-z",
            json!({ "podSelector": {}, "ingress": [{ "from": [ns_peer("z")] }] }),
        )]);
        flips_within(c, PodRef::new("z", "b"), A, true, "added");
        c.check(V4, &all().deny_to(Peer::ns("x")).allow_from_ns("z", Peer::ns("x")));
        c.delete_policy("x/deny");
        c.check(V4, &all().deny_to(Peer::ns("x")).allow_from_ns("z", Peer::ns("x")));
    });
    c.case("pod label added: the pod becomes isolated", |c| {
        c.apply(vec![policy(
            "x",
            "isolate",
            json!({ "podSelector": { "matchLabels": { "isolated": "yes" } }, "policyTypes": ["Ingress"] }),
        )]);
        c.check(V4, &all());
        c.set_pod_labels(A, &[("isolated", "yes")]);
        flips_within(c, B, A, false, "labelled");
        c.check(V4, &all().deny_to(XA));
        c.set_pod_labels(A, &[]);
        flips_within(c, B, A, true, "unlabelled");
    });
    c.case("pod label added: a client becomes allowed", |c| {
        c.apply(vec![policy("x", "a-from", json!({ "podSelector": { "matchLabels": { "pod": "a" } },
                                                   "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "pod2": "updated" } } }] }] }))]);
        c.check(V4, &all().deny_to(XA));
        c.set_pod_labels(PodRef::new("x", "c"), &[("pod2", "updated")]);
        flips_within(c, PodRef::new("x", "c"), A, true, "client labelled");
        c.check(V4, &all().deny_to(XA).allow(Peer::pod("x", "c"), XA));
    });
    c.case("namespace label added: its pods become allowed", |c| {
        c.apply(vec![policy("x", "a-from", json!({ "podSelector": { "matchLabels": { "pod": "a" } },
                                                   "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "ns2": "updated" } } }] }] }))]);
        c.check(V4, &all().deny_to(XA));
        c.set_namespace_labels("y", &[("ns2", "updated")]);
        flips_within(c, PodRef::new("y", "c"), A, true, "namespace labelled");
        c.check(V4, &all().deny_to(XA).allow_from_ns("y", XA));
        c.set_namespace_labels("y", &[]);
        flips_within(c, PodRef::new("y", "c"), A, false, "namespace unlabelled");
    });
    c.case("a pod added after the policy", |c| {
        // z is closed but to pods labelled `pod: d`; x/a admits only pods labelled `pod: d`.
        c.apply(vec![
            policy("z", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress"] })),
            policy("x", "a-from-d", json!({ "podSelector": { "matchLabels": { "pod": "a" } },
                                             "ingress": [{ "from": [{ "namespaceSelector": {}, "podSelector": { "matchLabels": { "pod": "d" } } }] }] })),
        ]);
        c.check(V4, &all().deny_to(Peer::ns("z")).deny_to(XA));
        let zd = PodRef::new("z", "d");
        c.mark_dirty();
        c.add_pod(zd, 1).expect("adding z/d");
        let want = Reachability::all_among(c.pod_refs(), true).deny_to(Peer::ns("z")).deny_to(XA).allow(Peer::pod("z", "d"), XA);
        c.check(V4, &want);
    });
    c.case("bad input: selectors that match nothing", |c| {
        c.apply(vec![
            policy("x", "nobody", json!({ "podSelector": { "matchLabels": { "pod": "nobody" } }, "policyTypes": ["Ingress", "Egress"] })),
            policy("x", "a-from-nobody", json!({ "podSelector": { "matchLabels": { "pod": "a" } },
                                                  "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "ns": "nowhere" } } }] }] })),
        ]);
        c.check(V4, &all().deny_to(XA));
        assert!(c.agents_alive(), "an agent ended");
        logged(c, "x/nobody");
    });
    c.case("bad input: a policy in a namespace that does not exist", |c| {
        c.apply(vec![
            policy("w", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress", "Egress"] })),
            policy(
                "x",
                "a-from-w",
                json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": [{ "from": [ns_peer("w")] }] }),
            ),
        ]);
        c.check(V4, &all().deny_to(XA));
        assert!(c.agents_alive(), "an agent ended");
        logged(c, "w/deny");
    });
    c.case("bad input: one policy of 10,000 rules", |c| {
        // 9,999 rules that match no pod (addresses outside the cluster, on ports nobody
        // serves) and one that admits namespace y.
        let mut rules: Vec<Value> = (0..9_999u32)
            .map(|i| {
                json!({ "from": [ip_block(&format!("100.64.{}.{}/32", i / 256, i % 256), &[])],
                             "ports": [{ "protocol": "TCP", "port": 1000 + i % 5000 }] })
            })
            .collect();
        rules.push(json!({ "from": [ns_peer("y")] }));
        c.apply(vec![policy(
            "x",
            "huge",
            json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": rules }),
        )]);
        c.check_within(V4, &all().deny_to(XA).allow_from_ns("y", XA), Duration::from_secs(15));
        assert!(c.agents_alive(), "an agent ended");
        logged(c, "x/huge");
    });
    c.case("after bad input, a plain policy still applies", |c| {
        c.apply(vec![deny_x()]);
        c.check(V4, &all().deny_to(Peer::ns("x")));
    });
    c.finish();
}
