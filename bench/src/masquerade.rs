//! Pod → external server through masquerade: ebpf-cni (BPF NAT on the uplink) vs bridge with
//! ipMasq (iptables MASQUERADE), each on a fresh cluster (a node with an uplink to an external
//! namespace), the order alternating. Throughput both ways on connections the pod opens (the
//! download takes the reverse-NAT path), and new connections per second (each one a new NAT
//! entry or conntrack entry).
use std::net::SocketAddrV4;

use anyhow::{Result, ensure};
use ebpf_cni_tests::{Cluster, EXT_SERVER, Plugin};

use crate::{
    Settings, conn_rate, iperf,
    iperf::SPLIT,
    report::{Better::*, Figure},
    topology::{self, Family, Pair, Path},
};

const SECTION: &str = "pod → external (masquerade)";
const CONN_PORT: u16 = 5301;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let bridge = Some(Path::Bridge);
    // The table shows the two plugins only: bare veth and loopback are pod → pod ceilings.
    let figure = |name: &str, unit, better| Figure::new(SECTION, name, unit, better).own_columns();
    let mut up = figure("TCP pod → external, 1 stream", "Gbit/s", Higher).target(bridge, 1.0);
    let mut down = figure("TCP external → pod (-R), 1 stream", "Gbit/s", Higher).target(bridge, 1.0);
    let mut retr = figure("TCP retransmits, pod → external", "per run", Lower);
    let mut conns = figure("TCP connections, one at a time", "conn/s", Higher).target(bridge, 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::PLUGINS, round) {
            let subnets = ["10.241.1.0/24", "10.241.2.0/24"];
            let mut cluster = Cluster::with_plugin(&format!("bm{round}"), "10.241.0.0/16", subnets, path.plugin(ours))?;
            let node = &mut cluster.nodes[0];
            let pod = node.new_pod()?;
            let conf = path.conf(node, Family::V4);
            let out = node.cni("ADD", pod, &conf)?;
            ensure!(out.success, "{} ADD failed: {}", path.name(), out.stdout);
            let pair = Pair::borrowed(&node.pods[pod].netns.name, &cluster.ext.name, EXT_SERVER);
            let upload = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
            let download = iperf::tcp(&pair, s.seconds, 1, SPLIT, true)?;
            let server = SocketAddrV4::new(EXT_SERVER.parse()?, CONN_PORT);
            let rate = conn_rate::per_second(&pair.client_ns, &pair.server_ns, server, server, s.latency_seconds)?;
            eprintln!(
                "masquerade round {round} {:8}: {:.2} Gbit/s up ({} retr), {:.2} down, {:.0} conn/s",
                path.name(),
                upload.gbits,
                upload.retransmits,
                download.gbits,
                rate
            );
            up.record(path, upload.gbits);
            down.record(path, download.gbits);
            retr.record(path, upload.retransmits as f64);
            conns.record(path, rate);
            let out = node.cni("DEL", pod, &conf)?;
            ensure!(out.success, "{} DEL failed: {}", path.name(), out.stdout);
        }
    }
    Ok(vec![up, down, retr, conns])
}
