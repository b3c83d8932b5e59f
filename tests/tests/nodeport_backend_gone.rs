//! Issue 25, item 5, for flows from the LAN (translated per packet, `SVC_CT`): when a NodePort's
//! backend is removed, an open TCP connection to it is ended at once (its next segment meets
//! the node's stack, which answers with a RST) instead of hanging on a dead backend, and a UDP
//! client's next datagram reaches a live backend. The backend on node 1 (local, client's
//! address kept) and on node 2 (SNATed), and what `service-set` says it ended.
use std::{
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    cgroup::TestCgroup,
    lan::{LAN_HOST, LAN_NODE_IPS, Lan, at},
    service_probe::{TCP_PORT, Tagged, UDP_PORT, ask},
    traffic::in_netns,
};

fn node1(port: u16) -> SocketAddr {
    SocketAddr::new(LAN_NODE_IPS[0].parse().unwrap(), port)
}

fn ask_udp(socket: &UdpSocket) -> std::io::Result<String> {
    socket.send(b"q")?;
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn lan_flows_to_a_removed_backend_end_at_once() {
    let test = "lan_flows_to_a_removed_backend_end_at_once";
    let Some(mut lan) = Lan::for_test(test, "npgone", "10.183.0.0/16", ["10.183.1.0/24", "10.183.2.0/24"]) else {
        return;
    };
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    lan.use_kube_proxy_replacement(0, &cgroup, "10.183.0.0/16", None);
    let (a, b) = (lan.add_pod(0).unwrap(), lan.add_pod(1).unwrap());
    let (_a, _b) = (Tagged::naming_peers(&a.netns, "A"), Tagged::naming_peers(&b.netns, "B"));
    let host = lan.host.name.clone();
    let (to_a, to_b) = (at(a.ip, TCP_PORT), at(b.ip, TCP_PORT));
    let node1_ip = LAN_NODE_IPS[0];

    for (what, port, first, then, first_answer, then_answer) in [
        ("local backend", 30080, &to_a, &to_b, format!("A {LAN_HOST}"), format!("B {node1_ip}")),
        ("backend on node 2 (SNAT)", 30081, &to_b, &to_a, format!("B {node1_ip}"), format!("A {LAN_HOST}")),
    ] {
        let frontend = format!("0.0.0.0:{port}");
        lan.service_set(0, &frontend, "tcp", std::slice::from_ref(first), &[]);
        let mut stream = in_netns(&host, move || Ok(TcpStream::connect_timeout(&node1(port), Duration::from_secs(2))?))
            .unwrap_or_else(|e| panic!("{what}: connecting: {e:#}"));
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert_eq!(ask(&mut stream), Ok(first_answer.clone()), "{what}: before");
        assert_eq!(ask(&mut stream), Ok(first_answer), "{what}: the connection lasts");

        let settled = lan.service_set(0, &frontend, "tcp", std::slice::from_ref(then), &[]);
        assert_eq!(settled["lan_flows"].as_u64(), Some(1), "{what}: {settled}");
        // The next segment meets the node's stack: a RST at once, not a read timing out.
        let ended = ask(&mut stream);
        println!("{what}: the open connection after its backend went: {ended:?}");
        match ended {
            Err((errno, took)) => {
                assert!(errno == libc::ECONNRESET || errno == 0, "{what}: errno {errno}");
                assert!(took < Duration::from_secs(1), "{what}: ended after {took:?}");
            }
            Ok(answer) => panic!("{what}: the removed backend still answers: {answer}"),
        }
        let mut fresh = in_netns(&host, move || Ok(TcpStream::connect_timeout(&node1(port), Duration::from_secs(2))?))
            .unwrap_or_else(|e| panic!("{what}: connecting again: {e:#}"));
        fresh.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert_eq!(ask(&mut fresh), Ok(then_answer), "{what}: a new connection");
    }

    // UDP: the same socket's next datagram opens a flow to the live backend.
    lan.service_set(0, "0.0.0.0:30053", "udp", &[at(a.ip, UDP_PORT)], &[]);
    let socket = in_netns(&host, || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.connect(node1(30053))?;
        Ok(socket)
    })
    .unwrap();
    assert_eq!(ask_udp(&socket).unwrap(), format!("A {LAN_HOST}"), "UDP before");
    let settled = lan.service_set(0, "0.0.0.0:30053", "udp", &[at(b.ip, UDP_PORT)], &[]);
    assert_eq!(settled["lan_flows"].as_u64(), Some(1), "UDP: {settled}");
    assert_eq!(ask_udp(&socket).unwrap(), format!("B {node1_ip}"), "UDP after its backend went");

    drop((a, b));
    lan.del_pod(0, 0).unwrap();
    lan.del_pod(1, 0).unwrap();
    assert_eq!(lan.nodes[0].leftovers().unwrap(), Vec::<String>::new());
}
