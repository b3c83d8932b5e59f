//! NetworkPolicy behind a Service (issue 27): with the socket LB (`kubeProxyReplacement`),
//! a client's connect to a ClusterIP becomes a connection to the backend pod, so the verdict is
//! the backend's policy, not the Service's address: every pod tries two Services (TCP and UDP),
//! one in front of a backend that admits only namespace y, one in front of an open backend.
use std::{
    fmt::Write as _,
    net::SocketAddrV4,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    fake_store::{SERVICES, SLICES},
    lan::Ipv6Plan,
    netpol::{Family::V4, NetpolCluster, Options, Peer, PodRef, Reachability, ns_peer, policy},
    service_probe::Client,
};
use serde_json::{Value, json};

const OPTIONS: Options = Options {
    tag: "npsv",
    cluster_cidr: "10.153.0.0/16",
    subnets: ["10.153.1.0/24", "10.153.2.0/24"],
    ipv6: Ipv6Plan { cluster_cidr: "fd00:10:153::/56", subnets: ["fd00:10:153:1::/64", "fd00:10:153:2::/64"] },
    kube_proxy_replacement: true,
};

/// (Service name, ClusterIP, backend).
const SERVICES_UNDER_TEST: [(&str, &str, PodRef); 2] =
    [("guarded", "10.96.15.10", PodRef::new("x", "a")), ("open", "10.96.15.11", PodRef::new("x", "b"))];

fn service(name: &str, ip: &str) -> Value {
    json!({ "metadata": { "namespace": "x", "name": name },
            "spec": { "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                      "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 80 },
                                { "name": "dns", "port": 81, "protocol": "UDP", "targetPort": 81 }] } })
}

fn slice(name: &str, backend: SocketAddrV4) -> Value {
    json!({ "metadata": { "namespace": "x", "name": format!("{name}-1"), "labels": { "kubernetes.io/service-name": name } },
            "addressType": "IPv4",
            "endpoints": [{ "addresses": [backend.ip().to_string()], "conditions": { "ready": true, "serving": true, "terminating": false } }],
            "ports": [{ "name": "http", "port": 80, "protocol": "TCP" }, { "name": "dns", "port": 81, "protocol": "UDP" }] })
}

/// Which backend answered over TCP and over UDP (`None`: nothing did).
type Answers = (Option<String>, Option<String>);

/// From `client` through the ClusterIP `vip`: which backend answered over TCP 80 and over UDP 81
/// (`None`: no answer).
fn through_service(c: &NetpolCluster, client: PodRef, vip: &str) -> Answers {
    let (cgroup, pod) = (c.cgroup.as_ref().expect("the socket LB's cgroup"), &c.pods[&client].pod);
    let tcp = Client::once(cgroup, pod, &["tcp", vip, "80"]);
    let udp = Client::start(cgroup, pod, &["udp", vip, "81", "3", "0.05"]);
    let udp_reply = (0..3).find_map(|_| udp.try_next(Duration::from_secs(2))?["reply"].as_str().map(String::from));
    (tcp["reply"].as_str().map(String::from), udp_reply)
}

#[test]
fn netpol_services() {
    let Some(mut c) = NetpolCluster::for_test("netpol_services", OPTIONS) else { return };
    for (name, vip, backend) in SERVICES_UNDER_TEST {
        c.store.put(SERVICES, [service(name, vip)]);
        c.store.put(SLICES, [slice(name, SocketAddrV4::new(c.pods[&backend].pod.ip, 80))]);
    }
    // The Services reach the socket LB: an allowed client gets the backend.
    let deadline = Instant::now() + Duration::from_secs(15);
    while through_service(&c, PodRef::new("y", "a"), SERVICES_UNDER_TEST[0].1).0.as_deref() != Some("x/a") {
        assert!(Instant::now() < deadline, "the Service never answered; agents' logs:\n{}", c.agents[0].log());
    }

    c.case("a Service in front of a denied backend: the backend's verdict", |c| {
        c.apply(vec![policy("x", "a-from-y", json!({ "podSelector": { "matchLabels": { "pod": "a" } },
                                                      "ingress": [{ "from": [ns_peer("y")] }] }))]);
        let direct = Reachability::all(true).deny_to(Peer::pod("x", "a")).allow_from_ns("y", Peer::pod("x", "a"));
        c.check(V4, &direct);
        // Every client through both Services at once (a denied TCP connect waits 3 s).
        let clients = PodRef::all();
        let results: Vec<(PodRef, &str, Answers)> = std::thread::scope(|s| {
            let c = &*c;
            let handles: Vec<_> = clients
                .iter()
                .flat_map(|&client| SERVICES_UNDER_TEST.iter().map(move |svc| (client, svc)))
                .filter(|(client, (_, _, backend))| client != backend)
                .map(|(client, &(name, vip, _))| s.spawn(move || (client, name, through_service(c, client, vip))))
                .collect();
            handles.into_iter().map(|h| h.join().expect("a client thread")).collect()
        });
        let mut table = String::from("through a Service (rows from; '.' the backend answered, 'X' nothing, '*' not as expected):\n      guarded-tcp guarded-udp open-tcp    open-udp\n");
        let mut wrong = 0;
        for client in &clients {
            let _ = write!(table, "{:6}", client.to_string());
            for (name, _, backend) in SERVICES_UNDER_TEST {
                let Some((_, _, (tcp, udp))) = results.iter().find(|(cl, n, _)| cl == client && *n == name) else {
                    table.push_str(&format!("{:12}{:12}", "-", "-"));
                    continue;
                };
                let allowed = name == "open" || client.ns == "y";
                for got in [tcp, udp] {
                    let ok = got.as_deref() == Some(backend.to_string().as_str());
                    let mark = if ok == allowed { "" } else { "*" };
                    wrong += usize::from(ok != allowed || (got.is_some() && !ok));
                    let _ = write!(table, "{:12}", format!("{}{mark}", if ok { "." } else { "X" }));
                }
            }
            table.push('\n');
        }
        println!("{table}");
        c.tally.probes += results.len() * 2;
        c.tally.wrong += wrong;
        assert_eq!(wrong, 0, "{wrong} Service probes wrong:\n{table}");
    });
    c.finish();
}
