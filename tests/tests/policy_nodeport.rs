//! NetworkPolicy on the per-packet Service path: a LAN host calls node 1's NodePorts (no
//! kube-proxy: `svc_from_uplink` translates, and its entry delivers into the local backend
//! with the ingress check, `policy::DEFERRED`), the backend isolated for ingress by a policy
//! written with `ebpf-cni policy-set`. An ipBlock holding the client's address lets the calls
//! in (TCP and UDP, IPv4 and IPv6); the same block with the client's address excepted denies
//! them, each counted as policy-denied.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    lan::{Ipv6Plan, LAN_HOST, LAN_HOST_V6, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan, at},
    policy_maps::policy_set,
    service_probe::{TCP_PORT, Tagged, UDP_PORT},
    traffic::in_netns,
};
use ebpf_common::{DropReason, ForwardPath};
use serde_json::{Value, json};

/// The reply, or `None` when nothing came back in time.
fn tcp_call(netns: &str, to: SocketAddr) -> Option<String> {
    in_netns(netns, move || {
        let Ok(mut stream) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) else { return Ok(None) };
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"q")?;
        let mut buf = [0u8; 64];
        Ok(stream.read(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned()))
    })
    .unwrap()
}

fn udp_call(netns: &str, to: SocketAddr) -> Option<String> {
    in_netns(netns, move || {
        let socket = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(to)?;
        socket.send(b"a query long enough to be quoted by an ICMPv6 error, if one came...")?;
        let mut buf = [0u8; 64];
        Ok(socket.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned()))
    })
    .unwrap()
}

/// The backend's policy: in from the LAN's block (TCP and UDP on the served ports), but for
/// the addresses `except`.
fn objects(backend: &[String; 2], except: &[&str; 2]) -> Value {
    let block = |cidr: &str, except: &str| {
        let except: Vec<&str> = Some(except).filter(|e| !e.is_empty()).into_iter().collect();
        json!({"ipBlock": {"cidr": cidr, "except": except}})
    };
    json!({
        "namespaces": [{"metadata": {"name": "x"}}],
        "pods": [{
            "metadata": {"namespace": "x", "name": "a", "labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": backend[0],
                       "podIPs": [{"ip": backend[0]}, {"ip": backend[1]}]},
        }],
        "networkPolicies": [{
            "metadata": {"namespace": "x", "name": "from-the-lan"},
            "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [block("192.0.2.0/24", except[0]), block("fd00:192:0:2::/64", except[1])],
                                  "ports": [{"protocol": "TCP", "port": TCP_PORT}, {"protocol": "UDP", "port": UDP_PORT}]}]},
        }],
    })
}

#[test]
fn a_nodeport_into_an_isolated_backend_is_judged_by_the_clients_address() {
    let test = "a_nodeport_into_an_isolated_backend_is_judged_by_the_clients_address";
    let plan = Ipv6Plan { cluster_cidr: "fd00:10:98::/56", subnets: ["fd00:10:98:1::/64", "fd00:10:98:2::/64"] };
    let Some(mut lan) =
        Lan::for_test_dual_stack(test, "polnp", "10.198.0.0/16", ["10.198.1.0/24", "10.198.2.0/24"], plan)
    else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    let cluster = format!("10.198.0.0/16,{}", plan.cluster_cidr);
    lan.use_kube_proxy_replacement(0, &cgroup, &cluster, Some(plan.subnets[0]));
    let a = lan.add_pod(0).unwrap();
    let _a = Tagged::naming_peers(&a.netns, "A");
    let a6 = a.ip6.unwrap();
    lan.service_set(0, "0.0.0.0:30080", "tcp", &[at(a.ip, TCP_PORT)], &[]);
    lan.service_set(0, "0.0.0.0:30053", "udp", &[at(a.ip, UDP_PORT)], &[]);
    lan.service_set(0, "[::]:30080", "tcp", &[at(a6, TCP_PORT)], &[]);
    lan.service_set(0, "[::]:30053", "udp", &[at(a6, UDP_PORT)], &[]);
    let host = lan.host.name.clone();
    let tb = &lan.nodes[0];
    let backend = [a.ip.to_string(), a6.to_string()];
    let node = |ip: &str, port| SocketAddr::new(ip.parse().unwrap(), port);
    let calls = [
        ("TCP", LAN_HOST, node(LAN_NODE_IPS[0], 30080)),
        ("UDP", LAN_HOST, node(LAN_NODE_IPS[0], 30053)),
        ("IPv6 TCP", LAN_HOST_V6, node(LAN_NODE_IPV6S[0], 30080)),
        ("IPv6 UDP", LAN_HOST_V6, node(LAN_NODE_IPV6S[0], 30053)),
    ];
    let call = |what: &str, to| if what.ends_with("TCP") { tcp_call(&host, to) } else { udp_call(&host, to) };

    // The LAN's block holds the host: every call gets in, the client's address kept.
    let wrote = policy_set(tb, &objects(&backend, &["", ""]));
    assert_eq!(wrote["failed"], json!(0), "{wrote}");
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    let translated = tb.forwarded(ForwardPath::ServiceTranslated).unwrap();
    for (what, client, to) in calls {
        assert_eq!(call(what, to), Some(format!("A {client}")), "{what} NodePort, the client in the block");
    }
    // Delivered by the Service program itself, not by the stack.
    assert!(tb.forwarded(ForwardPath::ServiceTranslated).unwrap() >= translated + 4, "not the per-packet path");
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied, "an allowed call was counted denied");

    // The host's address excepted: every new call is denied, and counted.
    policy_set(tb, &objects(&backend, &[&format!("{LAN_HOST}/32"), &format!("{LAN_HOST_V6}/128")]));
    for (what, _, to) in calls {
        let before = tb.drops(DropReason::PolicyDenied).unwrap();
        assert_eq!(call(what, to), None, "{what} NodePort, the client excepted from the block");
        assert!(tb.drops(DropReason::PolicyDenied).unwrap() > before, "{what}: not counted as policy-denied");
    }
    // And in again once the block holds it.
    policy_set(tb, &objects(&backend, &["", ""]));
    assert_eq!(call("TCP", calls[0].2), Some(format!("A {LAN_HOST}")), "TCP NodePort, the block back");
}
