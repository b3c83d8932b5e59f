//! Pod → ClusterIP → pod on one node, at 1 Service and at many (10,000; the measured one last
//! in kube-proxy's rule order), on four paths built fresh each time:
//!
//! - ebpf-cni with its own Service LB: kubeProxyReplacement on, not one iptables or nft rule,
//!   the Services written into its maps with `ebpf-cni service-set --from-file`, the clients
//!   started in a cgroup of the bench's own, where its programs translate their connections
//!   (the servers stay in their pod); the same pair's pod → pod ping-pong is the yardstick of
//!   "a Service costs nothing per packet";
//! - ebpf-cni with kube-proxy's iptables rules (at 1 Service only): it hands a packet to a
//!   ClusterIP to the node's stack, where the rules apply;
//! - bridge with kube-proxy's iptables rules, and with its nftables rules
//!   (`ebpf_cni_tests::kube_proxy`): bridge switches through `cni0` with
//!   `bridge-nf-call-iptables` on, as kube-proxy requires, so conntrack un-DNATs the replies.
//!
//! Every connection is a new conntrack entry on the kube-proxy paths: the connection rate
//! measures that, and how it falls as KUBE-SERVICES grows. Then `service_sync.rs`: how long
//! one EndpointSlice change takes to reach ebpf-cni's datapath at many Services, against the
//! restore of kube-proxy's whole rule set (timed while the paths above are built).
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Instant,
};

use anyhow::{Context, Result};
use ebpf_cni_tests::{
    Plugin,
    kube_proxy::{self, Flavour},
    run_in,
};

use crate::{
    Settings, conn_rate, iperf,
    iperf::SPLIT,
    report::{self, Better::*, Figure},
    service_set::{self, CLUSTER_IP, CONN_PORT},
    service_sync,
    sockperf::{self, LATENCY_CPU},
    topology::{self, Family, Pair, Path},
};

const SECTION: &str = "pod → ClusterIP → pod";
/// kube-proxy's `--cluster-cidr`: the pods of the test node are in it.
const CLUSTER_CIDR: &str = "10.242.0.0/16";
const PATHS: [Path; 4] = [Path::EbpfCni, Path::EbpfCniKubeProxy, Path::Bridge, Path::BridgeNft];

/// The figures at one Service count.
struct Level {
    services: usize,
    tcp_rtt: Figure,
    conns: Figure,
    /// Only at 1 Service: the figures of the section before it had 10,000.
    full: Option<Full>,
}

struct Full {
    tcp: Figure,
    retr: Figure,
    udp: Figure,
    udp_rtt: Figure,
}

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let bridge = Some(Path::Bridge);
    let own = Some(Path::OwnPodToPod);
    let mut levels = [1, s.services].map(|services| {
        let at = count(services);
        let conns_target = if services == 1 { 1.3 } else { 2.0 };
        Level {
            services,
            tcp_rtt: Figure::new(SECTION, format!("TCP ping-pong RTT p50 (same CPU), {at}"), "µs", Lower)
                .target(own, 1.02),
            conns: Figure::new(SECTION, format!("TCP connections, one at a time, {at}"), "conn/s", Higher)
                .target(bridge, conns_target),
            full: (services == 1).then(|| Full {
                tcp: Figure::new(SECTION, format!("TCP, 1 stream (CPUs 0→1), {at}"), "Gbit/s", Higher)
                    .target(bridge, 1.0),
                retr: Figure::new(SECTION, format!("TCP retransmits, 1 stream, {at}"), "per run", Lower),
                udp: Figure::new(SECTION, format!("UDP 64 B received (CPUs 0→1), {at}"), "kpps", Higher)
                    .target(bridge, 1.0),
                udp_rtt: Figure::new(SECTION, format!("UDP ping-pong RTT p50 (same CPU), {at}"), "µs", Lower)
                    .target(bridge, 1.0),
            }),
        }
    });
    let many = count(s.services);
    let mut flat =
        Figure::new(SECTION, format!("TCP connections/s, {many} ÷ 1 Service"), "ratio", Higher).target(None, 0.95);
    let sync = |what: &str| format!("{what}, {many} (kube-proxy: restore of its whole rule set)");
    let mut sync_p50 = Figure::new(SECTION, sync("EndpointSlice event → datapath p50"), "ms", Lower);
    let mut sync_p99 =
        Figure::new(SECTION, sync("EndpointSlice event → datapath p99"), "ms", Lower).pooled_p99().target(None, 50.0);
    let mut first =
        Figure::new(SECTION, format!("agent start → {many} in the datapath"), "ms", Lower).target(None, 2000.0);
    for round in 0..s.rounds {
        let mut rates = Vec::new();
        for level in &mut levels {
            // ebpf-cni + kube-proxy at 1 Service only: restoring 10,000 Services' iptables rules
            // takes minutes here (iptables-nft), and the bridge path already times it.
            let one = level.services == 1;
            let paths = topology::rotated(PATHS, round).into_iter();
            for path in paths.filter(|p| one || *p != Path::EbpfCniKubeProxy) {
                let (rate, restore_ms) = measure(s, ours, path, level)?;
                rates.push((path, level.services, rate));
                if let Some(ms) = restore_ms.filter(|_| level.services > 1) {
                    sync_p50.record(path, ms);
                    sync_p99.record_round(path, &[ms].into_iter().collect());
                }
            }
        }
        for path in PATHS {
            let rate = |n: usize| rates.iter().find(|(p, c, _)| *p == path && *c == n).map(|r| r.2);
            if let (Some(one), Some(large)) = (rate(1), rate(s.services)) {
                flat.record(path, large / one);
            }
        }
        let synced = service_sync::measure(ours, s.services, s.service_changes)?;
        eprintln!(
            "Services round {round}: {many} in the datapath {:.0} ms after the agent's start; a change p50 {:.1} ms, \
             p99 {:.1} ms",
            synced.first_ms,
            synced.changes_ms.median(),
            synced.changes_ms.p99()
        );
        first.record(Path::EbpfCni, synced.first_ms);
        sync_p50.record(Path::EbpfCni, synced.changes_ms.median());
        sync_p99.record_round(Path::EbpfCni, &synced.changes_ms);
    }
    let mut figures = Vec::new();
    for level in levels {
        if let Some(full) = level.full {
            figures.extend([full.tcp, full.retr, full.udp]);
            figures.extend([level.tcp_rtt, full.udp_rtt, level.conns]);
        } else {
            figures.extend([level.tcp_rtt, level.conns]);
        }
    }
    figures.extend([flat, first, sync_p50, sync_p99]);
    Ok(figures)
}

/// "1 Service", "10,000 Services".
fn count(n: usize) -> String {
    let out = report::thousands(n);
    if n == 1 { format!("{out} Service") } else { format!("{out} Services") }
}

/// One path at one level, its figures recorded; its connection rate, and how long the restore
/// of kube-proxy's rules took on a kube-proxy path.
fn measure(s: &Settings, ours: &Plugin, path: Path, level: &mut Level) -> Result<(f64, Option<f64>)> {
    let (pair, restore_ms) = through_cluster_ip(path, ours, level.services)?;
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let (listen, dial) = (SocketAddrV4::new(server, CONN_PORT), SocketAddrV4::new(CLUSTER_IP, CONN_PORT));
    let conns = |seconds| {
        conn_rate::per_second_in_process(
            &pair.client_ns,
            pair.client_cgroup(),
            &pair.server_ns,
            listen,
            dial,
            seconds,
            None,
        )
    };
    // One connection first: a path that cannot connect says so at once.
    conns(0).with_context(|| format!("{}: pod → ClusterIP → pod does not connect", path.name()))?;
    let at = count(level.services);
    let mut line = format!("ClusterIP {at} round: {:22}", path.name());
    if let Some(full) = &mut level.full {
        let one = iperf::tcp(&pair, s.seconds, 1, SPLIT, false)?;
        let small = iperf::udp(&pair, s.seconds, 64, SPLIT)?;
        let udp_pp = sockperf::ping_pong(&pair, sockperf::Protocol::Udp, s.latency_seconds, LATENCY_CPU)?;
        full.tcp.record(path, one.gbits);
        full.retr.record(path, one.retransmits as f64);
        full.udp.record(path, small.pps / 1e3);
        full.udp_rtt.record(path, udp_pp.p50_us);
        line += &format!(
            " TCP {:.2} Gbit/s ({} retr), UDP {:.0} kpps, UDP RTT {:.1} µs,",
            one.gbits,
            one.retransmits,
            small.pps / 1e3,
            udp_pp.p50_us
        );
    }
    let tcp_pp = sockperf::ping_pong(&pair, sockperf::Protocol::Tcp, s.latency_seconds, LATENCY_CPU)?;
    level.tcp_rtt.record(path, tcp_pp.p50_us);
    line += &format!(" TCP RTT {:.1} µs", tcp_pp.p50_us);
    if path == Path::EbpfCni {
        // The same two pods, the client dialling the server itself.
        let direct = Pair::borrowed(&pair.client_ns, &pair.server_ns, &pair.server_ip);
        let pod_pp = sockperf::ping_pong(&direct, sockperf::Protocol::Tcp, s.latency_seconds, LATENCY_CPU)?;
        level.tcp_rtt.record(Path::OwnPodToPod, pod_pp.p50_us);
        line += &format!(" (pod → pod {:.1} µs)", pod_pp.p50_us);
    }
    let rate = conns(s.latency_seconds)?;
    level.conns.record(path, rate);
    if let Some(ms) = restore_ms {
        line += &format!(", {rate:.0} conn/s; rules restored in {ms:.0} ms");
    } else {
        line += &format!(", {rate:.0} conn/s");
    }
    eprintln!("{line}");
    Ok((rate, restore_ms))
}

/// Two pods on a fresh node of `path`'s plugin, `services` Services in front of the second
/// one (see `service_set.rs`), and clients that dial the measured one; for a kube-proxy path,
/// how long writing its rules took (ms).
fn through_cluster_ip(path: Path, ours: &Plugin, services: usize) -> Result<(Pair, Option<f64>)> {
    if path == Path::EbpfCni {
        let pair = topology::build_socket_lb(ours)?;
        let all = service_set::services(services, pair.server_ip.parse()?);
        service_set::write_to_maps(pair.node().context("a CNI path has a node")?, &all)?;
        return Ok((pair.dialling(&CLUSTER_IP.to_string()), None));
    }
    let pair = topology::build(path, ours, Family::V4)?;
    let node = &pair.node().context("a CNI path has a node")?.node.name;
    // A packet to a ClusterIP is routed by the node once kube-proxy's DNAT gave it a pod's
    // address: forwarding must be on, as on every Kubernetes node.
    run_in(node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    if path.base() == Path::Bridge {
        // Also what puts bridged IPv4 packets through nftables' `ip` family hooks.
        run_in(node, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
    }
    let flavour = if path == Path::BridgeNft { Flavour::Nftables } else { Flavour::Iptables };
    let all = service_set::services(services, pair.server_ip.parse()?);
    let started = Instant::now();
    kube_proxy::install(node, flavour, CLUSTER_CIDR, &all)?;
    let restore_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok((pair.dialling(&CLUSTER_IP.to_string()), Some(restore_ms)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_read_as_in_the_issue() {
        assert_eq!(super::count(1), "1 Service");
        assert_eq!(super::count(10_000), "10,000 Services");
        assert_eq!(super::count(500), "500 Services");
    }
}
