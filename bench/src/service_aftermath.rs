//! A pod after it served a Service (issue 24, item 8), ebpf-cni only: `from_pod`'s own cost per
//! packet for the pod's plain pod → pod traffic, measured in the kernel (`BPF_PROG_TEST_RUN`, a
//! million runs of one ACK, whose mean the kernel reports), at three moments: before any Service
//! used the pod, while a Service connection to it lives (its packets are looked up in `FLOWS`
//! first, so that the connection's replies take the stack), and once that connection is gone
//! (reset by the pod, aged as conntrack ages it, then two GCs: the pod's stack epoch lapses). A build whose
//! pods' marks never clear stays at the second figure. bridge has no such program: its cost of a
//! Service is conntrack's, on every packet, always.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    Attached, Cluster, Plugin,
    frames::{ethernet, ipv4, tcp, with_checksums},
    kube_proxy::{self, Flavour, Protocol, Service},
    prog_run,
    traffic::{self, tcp_connect},
};
use ebpf_common::FLOW_TIMEOUT_TCP_RST_NS;

use crate::{
    Settings,
    report::{Better::*, Figure},
    stats::Samples,
    topology::Path,
};

const SECTION: &str = "a pod after serving a Service (ebpf-cni only)";
const CLUSTER_CIDR: &str = "10.208.0.0/16";
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 96, 8, 1), 80);
const PORT: u16 = 8080;
/// Runs per timing: a program of ~100 ns takes a tenth of a second.
const REPEAT: u32 = 1_000_000;
/// Timings per moment and round; the round's value is their median.
const TIMINGS: usize = 5;
const TC_ACT_REDIRECT: u32 = 7;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let name = |moment: &str| format!("from_pod per packet, pod → pod ACK, {moment}");
    let mut moments = [
        Figure::new(SECTION, name("no Service ever used the pod"), "ns", Lower),
        Figure::new(SECTION, name("while it serves a Service connection"), "ns", Lower),
        Figure::new(SECTION, name("once that connection is gone"), "ns", Lower),
    ];
    for round in 0..s.rounds {
        let values = one_round(ours).with_context(|| format!("round {round}"))?;
        eprintln!("service aftermath round {round}: {values:.1?} ns");
        for (figure, value) in moments.iter_mut().zip(values) {
            figure.record(Path::EbpfCni, value);
        }
    }
    Ok(moments.into())
}

/// One node with a client and a server pod behind a ClusterIP: the three moments' costs.
fn one_round(ours: &Plugin) -> Result<[f64; 3]> {
    let subnets = ["10.208.1.0/24", "10.208.2.0/24"];
    let mut cluster = Cluster::with_plugin("bsa", CLUSTER_CIDR, subnets, ours.clone())?;
    let node = &mut cluster.nodes[0];
    let (client, server) = (node.new_pod()?, node.new_pod()?);
    let client_at = node.add_attachment(client)?;
    let server_at = node.add_attachment(server)?;
    let endpoint = SocketAddrV4::new(server_at.ip, PORT);
    let service = Service::new("default/aftermath:http", Protocol::Tcp, VIP, &[endpoint]);
    kube_proxy::install(&node.node.name, Flavour::Iptables, CLUSTER_CIDR, &[service])?;
    let listener =
        traffic::tcp_listener(&node.pods[server].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT))?;
    let valid = [client, server];

    let timed = |node: &ebpf_cni_tests::Testbed| cost(node, &server_at, &client_at);
    let before = timed(node)?;
    let (mut conn, accepted) = {
        let conn = tcp_connect(&node.pods[client].netns.name, 0, VIP)?;
        (conn, listener.accept()?.0)
    };
    traffic::ask_tcp(&mut conn).ok();
    let serving = timed(node)?;
    // Reset by the server pod itself (a peer's RST is not trusted to end an entry): the entry
    // ages in conntrack's CLOSE time.
    socket2::SockRef::from(&accepted).set_linger(Some(Duration::ZERO))?;
    drop(accepted);
    drop(conn);
    std::thread::sleep(Duration::from_nanos(FLOW_TIMEOUT_TCP_RST_NS + 500_000_000));
    node.gc(&valid)?;
    node.gc(&valid)?;
    let after = timed(node)?;
    Ok([before, serving, after])
}

/// `from_pod`'s mean time for the server pod's ACK to the client pod, median of `TIMINGS`.
fn cost(node: &ebpf_cni_tests::Testbed, from: &Attached, to: &Attached) -> Result<f64> {
    let frame = with_checksums(
        [ethernet(from.pod_mac, from.host_mac, 0x0800), ipv4(from.ip, to.ip, 6, &tcp(PORT + 1, 40_000, 0x10))].concat(),
    );
    let mut samples = Samples::default();
    for _ in 0..TIMINGS {
        let (verdict, mean) = prog_run::time(node, "from_pod", &from.host_ifname, frame.clone(), REPEAT)?;
        ensure!(verdict == TC_ACT_REDIRECT, "from_pod did not take the fast path (verdict {verdict})");
        samples.push(mean.as_secs_f64() * 1e9);
    }
    Ok(samples.median())
}
