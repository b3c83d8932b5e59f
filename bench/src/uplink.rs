//! The uplink's programs with and without `kubeProxyReplacement`, ebpf-cni only. With it,
//! `svc_from_uplink` runs before `from_uplink` on every packet the node receives from the LAN,
//! and `svc_to_uplink` before `to_uplink` on every one it sends: Services cost something to
//! traffic that is no Service's. Measured per packet in the kernel (`prog_cost.rs`), on a LAN of
//! two nodes built fresh each round, node 1 with `kubeProxyReplacement` (its programs in a
//! cgroup of this run's own), node 2 without; both masquerade. Packets, each on both nodes: a
//! TCP ACK from a pod of the other node to a pod of this one (IPv4 and IPv6; `svc_from_uplink`
//! looks its source up among the endpoints, its flow in `SVC_CT`); one from the LAN to the
//! node's own address on a port that is no Service's (kubelet's, ssh's: `SVC_CT`, the frontends
//! by the address, then by "any node address", before `from_uplink` finds it no masquerade
//! reply); a pod's ACK out to the outside on a flow a real connection opened (masqueraded; one
//! `SVC_CT` lookup before). "On" is the Service program plus the plain one on what the first
//! left; "÷" is on over off, per round. Every figure holds the test run's floor per run (given
//! too); on a real uplink a second filter likely costs less than that, so "÷" may overstate the
//! Services' share by up to one floor over "off".
//! And what a Service's own packets cost (node 1 only): an ACK of a NodePort flow a LAN client
//! opened to a pod of the node (translated and delivered by `svc_from_uplink` alone, `from_uplink`
//! never runs), and the pod's ACK back (translated by `svc_to_uplink`, then `to_uplink`).
use std::{
    net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, TcpStream},
    process::Command,
};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    EXT_SERVER, Plugin, Testbed,
    cgroup::TestCgroup,
    frames::{ethernet, ipv4, ipv6, tcp, with_checksums},
    lan::{Ipv6Plan, LAN_HOST, LAN_NODE_IPS, Lan, PodNetwork},
    prog_run::{TC_ACT_REDIRECT, TC_ACT_UNSPEC},
    traffic::{tcp_connect, tcp_listener},
};
use ebpf_common::names::{FROM_UPLINK, FROM_UPLINK6, SVC_FROM_UPLINK, SVC_FROM_UPLINK6, SVC_TO_UPLINK, TO_UPLINK};

use crate::{
    Settings,
    prog_cost::{Runs, Timed, cost, floor},
    report::{Better::*, Figure},
    topology::{self, Path},
};

const SECTION: &str = "the uplink, kubeProxyReplacement off and on (ebpf-cni only)";
const CLUSTER_CIDR: &str = "10.209.0.0/16";
const PLAN: Ipv6Plan<'static> =
    Ipv6Plan { cluster_cidr: "fd00:10:209::/56", subnets: ["fd00:10:209:1::/64", "fd00:10:209:2::/64"] };
/// The nodes: `ON` has `kubeProxyReplacement`, `OFF` not.
const ON: usize = 0;
const OFF: usize = 1;
const EXT_PORT: u16 = 5310;
const NODE_PORT: u16 = 30080;
const BACKEND_PORT: u16 = 8080;
const ACK: u8 = 0x10;
/// Services may cost other traffic on the uplink at most this much.
const TARGET: f64 = 1.10;

/// The packets timed on both nodes: the Service program, the plain one after it, and whether
/// one of them rewrites the packet (then every figure of the case is timed by single runs).
const CASES: [(&str, &str, &str, bool); 4] = [
    ("pod of another node → pod, TCP ACK in", SVC_FROM_UPLINK, FROM_UPLINK, false),
    ("pod of another node → pod over IPv6, TCP ACK in", SVC_FROM_UPLINK6, FROM_UPLINK6, false),
    ("LAN → the node's address, no Service's port, TCP ACK in", SVC_FROM_UPLINK, FROM_UPLINK, false),
    ("pod → outside, masqueraded, TCP ACK out", SVC_TO_UPLINK, TO_UPLINK, true),
];
const NODE_PORT_IN: &str = "NodePort flow, LAN → node → pod of the node, TCP ACK in";
const NODE_PORT_OUT: &str = "NodePort flow, the pod's TCP ACK back out";

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for (case, svc, plain, _) in CASES {
        let ns = |what: String| Figure::new(SECTION, format!("{case}: {what}"), "ns", Lower);
        figures.push(ns(format!("off, {plain}")));
        figures.push(ns(format!("on, {svc} + {plain}")));
        figures.push(ns(format!("on, {svc} alone")));
        figures.push(ns(format!("on, {plain} alone")));
        figures.push(Figure::new(SECTION, format!("{case}: on ÷ off"), "ratio", Lower).target(None, TARGET));
    }
    let ns = |name: String| Figure::new(SECTION, name, "ns", Lower);
    figures.push(ns(format!("{NODE_PORT_IN}: {SVC_FROM_UPLINK} (translates, delivers)")));
    figures.push(ns(format!("{NODE_PORT_OUT}: {SVC_TO_UPLINK} + {TO_UPLINK}")));
    figures.push(ns(format!("{NODE_PORT_OUT}: {SVC_TO_UPLINK} alone (translates)")));
    figures.push(ns(format!("{NODE_PORT_OUT}: {TO_UPLINK} alone")));
    figures.push(ns(format!("floor: {SVC_FROM_UPLINK} on a frame that is not IP (returns at once)")));
    let runs = Runs { repeat: s.prog_runs, singles: (s.prog_runs / 200).max(20) as usize };
    for round in 0..s.rounds {
        let values = one_round(ours, runs).with_context(|| format!("uplink round {round}"))?;
        eprintln!("uplink round {round}: {values:.1?}");
        ensure!(values.len() == figures.len(), "{} values for {} figures", values.len(), figures.len());
        for (figure, value) in figures.iter_mut().zip(values) {
            figure.record(Path::EbpfCni, value);
        }
    }
    Ok(figures)
}

/// One LAN: every figure's value, in `run`'s order.
fn one_round(ours: &Plugin, runs: Runs) -> Result<Vec<f64>> {
    // Declared first, dropped last: after the nodes, whose programs are attached to it.
    let cgroup = TestCgroup::create(&topology::unique("upl"))?;
    let subnets = ["10.209.1.0/24", "10.209.2.0/24"];
    let mut lan = Lan::with_plugin("bup", PodNetwork::EbpfCni, CLUSTER_CIDR, subnets, Some(PLAN), ours.clone())?;
    let cluster = format!("{CLUSTER_CIDR},{}", PLAN.cluster_cidr);
    lan.use_kube_proxy_replacement(ON, &cgroup, &cluster, Some(PLAN.subnets[ON]));
    let pods = [lan.add_pod(ON)?, lan.add_pod(OFF)?];
    let (ip6, mac) = (|i: usize| pods[i].ip6.context("no IPv6 address"), [lan.node_mac(ON)?, lan.node_mac(OFF)?]);
    let node_ip = |i: usize| -> Ipv4Addr { LAN_NODE_IPS[i].parse().expect("a node address") };

    // Real flows first: masquerade's entries for each pod's connection out, the NodePort's.
    let ext = SocketAddrV4::new(EXT_SERVER.parse()?, EXT_PORT);
    let ext_listener = tcp_listener(&lan.ext.name, ext)?;
    let out_flows = [tcp_connect(&pods[ON].netns, 0, ext)?, tcp_connect(&pods[OFF].netns, 0, ext)?];
    let _accepted = [ext_listener.accept()?, ext_listener.accept()?];
    let backend_listener = tcp_listener(&pods[ON].netns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, BACKEND_PORT))?;
    node_port(&lan.nodes[ON], SocketAddrV4::new(pods[ON].ip, BACKEND_PORT))?;
    let client = tcp_connect(&lan.host.name, 0, SocketAddrV4::new(node_ip(ON), NODE_PORT))?;
    let _backend = backend_listener.accept()?;

    let frames = |i: usize| -> Result<[Vec<u8>; 4]> {
        let other = 1 - i;
        Ok([
            inbound4(mac[i], pods[other].ip, 40_000, pods[i].ip, 8081),
            inbound6(mac[i], ip6(other)?, 40_000, ip6(i)?, 8081),
            inbound4(mac[i], LAN_HOST.parse()?, 40_000, node_ip(i), 22),
            outbound4(mac[i], pods[i].ip, port(&out_flows[i])?, *ext.ip(), EXT_PORT),
        ])
    };
    let (on, off) = (frames(ON)?, frames(OFF)?);
    let mut values = Vec::new();
    for (c, (case, svc, plain, singles)) in CASES.into_iter().enumerate() {
        let without = cost(&lan.nodes[OFF], plain, &off[c], runs, singles)?;
        let first = cost(&lan.nodes[ON], svc, &on[c], runs, singles)?;
        ensure!(first.verdict == TC_ACT_UNSPEC && !first.rewrote, "{case}: {svc} touched the packet");
        let then = cost(&lan.nodes[ON], plain, &first.out, runs, singles)?;
        for (node, timed) in [(OFF, &without), (ON, &then)] {
            check(case, timed, node_ip(node))?;
        }
        let sum = first.ns + then.ns;
        values.extend([without.ns, sum, first.ns, then.ns, sum / without.ns]);
    }

    let client_port = port(&client)?;
    let host: Ipv4Addr = LAN_HOST.parse()?;
    let ack = inbound4(mac[ON], host, client_port, node_ip(ON), NODE_PORT);
    let into = cost(&lan.nodes[ON], SVC_FROM_UPLINK, &ack, runs, true)?;
    ensure!(into.verdict == TC_ACT_REDIRECT && into.rewrote, "{NODE_PORT_IN}: not translated into the pod");
    let reply = outbound4(mac[ON], pods[ON].ip, BACKEND_PORT, host, client_port);
    let back = cost(&lan.nodes[ON], SVC_TO_UPLINK, &reply, runs, true)?;
    ensure!(back.verdict == TC_ACT_UNSPEC && back.rewrote, "{NODE_PORT_OUT}: not translated");
    let then = cost(&lan.nodes[ON], TO_UPLINK, &back.out, runs, true)?;
    ensure!(then.verdict == TC_ACT_UNSPEC && !then.rewrote, "{NODE_PORT_OUT}: {TO_UPLINK} touched the reply");
    values.extend([into.ns, back.ns + then.ns, back.ns, then.ns]);
    values.push(floor(&lan.nodes[ON], SVC_FROM_UPLINK, &ack, runs)?);
    Ok(values)
}

/// The plain program did what it does with such a packet: a pod's delivered, the node's left to
/// the stack, a pod's going out masqueraded.
fn check(case: &str, timed: &Timed, node_ip: Ipv4Addr) -> Result<()> {
    let source = timed.out.get(26..30).context("a short frame")?;
    let ok = match case {
        c if c.starts_with("pod of another node") => timed.verdict == TC_ACT_REDIRECT,
        c if c.starts_with("pod → outside") => timed.verdict == TC_ACT_UNSPEC && source == node_ip.octets(),
        _ => timed.verdict == TC_ACT_UNSPEC && !timed.rewrote,
    };
    ensure!(ok, "{case}: verdict {}, rewritten: {}", timed.verdict, timed.rewrote);
    Ok(())
}

/// The NodePort's only endpoint is `backend` (`ebpf-cni service-set`, the agent's writer).
fn node_port(tb: &Testbed, backend: SocketAddrV4) -> Result<()> {
    let out = Command::new(&tb.plugin.binary)
        .args(["service-set", "--network", &tb.network, "--bpffs-root"])
        .arg(tb.bpffs_root())
        .args(["--frontend", &format!("0.0.0.0:{NODE_PORT}"), "--protocol", "tcp"])
        .args(["--backend", &backend.to_string()])
        .output()?;
    ensure!(out.status.success(), "service-set: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

fn port(stream: &TcpStream) -> Result<u16> {
    Ok(stream.local_addr()?.port())
}

/// An ACK from the LAN to the node's MAC (the Service programs leave another host's alone).
fn inbound4(node_mac: [u8; 6], src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    with_checksums([ethernet(node_mac, [2; 6], 0x0800), ipv4(src, dst, 6, &tcp(sport, dport, ACK))].concat())
}

fn inbound6(node_mac: [u8; 6], src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    [ethernet(node_mac, [2; 6], 0x86dd), ipv6(src, dst, 6, &tcp(sport, dport, ACK))].concat()
}

/// An ACK the node sends out of its uplink.
fn outbound4(node_mac: [u8; 6], src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    with_checksums([ethernet([2; 6], node_mac, 0x0800), ipv4(src, dst, 6, &tcp(sport, dport, ACK))].concat())
}
