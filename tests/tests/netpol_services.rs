//! NetworkPolicy behind a Service (issue 27): with the socket LB (`kubeProxyReplacement`),
//! a client's connect to a ClusterIP becomes a connection to the backend pod, so the verdict is
//! the backend's policy, not the Service's address: every pod tries two Services (TCP and UDP),
//! one in front of a backend that admits only namespace y, one in front of an open backend; and
//! without the socket LB, through kube-proxy's own DNAT rules (iptables) in the nodes' stacks.
use std::{
    fmt::Write as _,
    net::SocketAddrV4,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    fake_store::{SERVICES, SLICES},
    kube_proxy::{self, Flavour, Protocol, Service},
    lan::Ipv6Plan,
    netpol::{
        Family::V4, NetpolCluster, Options, PROBE_TIMEOUT, Peer, PodRef, Probe, Reachability, TCP_80, UDP_81, ns_peer,
        policy, probe_once,
    },
    service_probe::Client,
};
use serde_json::{Value, json};

/// The ClusterIP only kube-proxy's rules know (not the API server, so not the socket LB).
const KUBE_PROXY_VIP: &str = "10.96.16.10";

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

/// x/a lets in namespace y only; checked on the pods' own addresses first.
fn admit_only_y_into_x_a(c: &mut NetpolCluster) {
    let spec = json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": [{ "from": [ns_peer("y")] }] });
    c.apply(vec![policy("x", "a-from-y", spec)]);
    let direct = Reachability::all(true).deny_to(Peer::pod("x", "a")).allow_from_ns("y", Peer::pod("x", "a"));
    c.check(V4, &direct);
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
        admit_only_y_into_x_a(c);
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
        let rows: Vec<Row> = clients
            .iter()
            .map(|client| {
                let cells = SERVICES_UNDER_TEST.iter().flat_map(|&(name, _, backend)| {
                    let found = results.iter().find(|(cl, n, _)| cl == client && *n == name);
                    let allowed = name == "open" || client.ns == "y";
                    let answered = |got: &Option<String>| got.as_deref() == Some(backend.to_string().as_str());
                    match found {
                        Some((_, _, (tcp, udp))) => [Some((allowed, answered(tcp))), Some((allowed, answered(udp)))],
                        None => [None, None],
                    }
                });
                (*client, cells.collect())
            })
            .collect();
        check_table(c, "through the socket LB", &["guarded-tcp", "guarded-udp", "open-tcp", "open-udp"], &rows);
    });
    c.case("kube-proxy's DNAT in front of a denied backend: the backend's verdict", |c| {
        // No socket LB for these: the test's own probes are not in its cgroup. kube-proxy's
        // rules on both nodes translate in the stack, and the verdict is taken where the
        // translated packet shows up.
        let backend = c.pods[&PodRef::new("x", "a")].pod.ip;
        let vip: std::net::IpAddr = KUBE_PROXY_VIP.parse().unwrap();
        let services = [
            Service::new("x/guarded-kp:http", Protocol::Tcp, (vip, 80), &[SocketAddrV4::new(backend, 80)]),
            Service::new("x/guarded-kp:dns", Protocol::Udp, (vip, 81), &[SocketAddrV4::new(backend, 81)]),
        ];
        for node in &c.lan.nodes {
            kube_proxy::install(&node.node.name, Flavour::Iptables, OPTIONS.cluster_cidr, &services).unwrap();
        }
        admit_only_y_into_x_a(c);
        let clients: Vec<PodRef> = PodRef::all().into_iter().filter(|p| *p != PodRef::new("x", "a")).collect();
        let rows: Vec<Row> = std::thread::scope(|s| {
            let c = &*c;
            let handles: Vec<_> = clients
                .iter()
                .map(|&client| {
                    s.spawn(move || {
                        let cells = [TCP_80, UDP_81].map(|target| {
                            let probe = Probe {
                                from_netns: c.pods[&client].pod.netns.clone(),
                                to: vip,
                                target,
                                tag: "x/a".into(),
                            };
                            let allowed = client.ns == "y";
                            let mut got = probe_once(&probe, PROBE_TIMEOUT).is_ok();
                            if allowed && !got {
                                got = probe_once(&probe, Duration::from_secs(1)).is_ok();
                            }
                            Some((allowed, got))
                        });
                        (client, cells.to_vec())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a probe thread")).collect()
        });
        check_table(c, "through kube-proxy's DNAT", &["guarded-tcp", "guarded-udp"], &rows);
    });
    c.finish();
}

/// A client's row: per column, (expected to reach the backend, reached it), `None` if not tried.
type Row = (PodRef, Vec<Option<(bool, bool)>>);

/// Prints the rows as a table (rows from; `.` the backend answered, `X` nothing, `*` not as
/// expected), counts them in the tally and fails the case on a wrong cell.
fn check_table(c: &mut NetpolCluster, title: &str, columns: &[&str], rows: &[Row]) {
    let mut table =
        format!("{title} (rows from; '.' the backend answered, 'X' nothing, '*' not as expected):\n{:6}", "");
    for column in columns {
        let _ = write!(table, "{column:12}");
    }
    table.push('\n');
    let (mut probes, mut wrong) = (0, 0);
    for (client, cells) in rows {
        let _ = write!(table, "{:6}", client.to_string());
        for cell in cells {
            let text = match cell {
                Some((want, got)) => {
                    probes += 1;
                    wrong += usize::from(want != got);
                    format!("{}{}", if *got { "." } else { "X" }, if want == got { "" } else { "*" })
                }
                None => "-".into(),
            };
            let _ = write!(table, "{text:12}");
        }
        table.push('\n');
    }
    println!("{table}");
    c.tally.probes += probes;
    c.tally.wrong += wrong;
    assert_eq!(wrong, 0, "{wrong} of {probes} Service probes wrong:\n{table}");
}
