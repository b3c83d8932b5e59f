//! The Services of the Service section, one list for every path: `count − 1` other Services
//! (3 endpoints each, nowhere on the bench's node), then the measured one, whose ports lead to
//! the server pod, last in kube-proxy's rule order (the worst case of its iptables mode, which
//! matches a packet against KUBE-SERVICES' rules one by one). kube-proxy's rules are written
//! from this list (`ebpf_cni_tests::kube_proxy`), ebpf-cni's maps with one
//! `ebpf-cni service-set --from-file` (the agent's writer; one process for all of them).
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{
    Testbed,
    kube_proxy::{Protocol, Service},
};
use serde_json::{Value, json};

use crate::{iperf, sockperf};

pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// Where the connection-rate server listens and its Service port.
pub const CONN_PORT: u16 = 5302;
/// The other Services' ClusterIPs count up from here, their endpoints from `ENDPOINTS`.
const OTHERS: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 0);
const ENDPOINTS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 0);
pub const OTHER_PORT: u16 = 80;
pub const TARGET_PORT: u16 = 8080;

/// Other Service number `i`'s ClusterIP.
pub fn other_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(OTHERS) + i as u32 + 1)
}

/// Other Service number `i`'s three endpoints.
pub fn other_endpoints(i: usize) -> [SocketAddrV4; 3] {
    let at = |j: u32| SocketAddrV4::new(Ipv4Addr::from(u32::from(ENDPOINTS) + 3 * i as u32 + j + 1), TARGET_PORT);
    [at(0), at(1), at(2)]
}

/// `count` Services (at least the measured one): the others, then the measured one's ports,
/// each with `server` as its only endpoint (iperf3's TCP and UDP, sockperf's, the connection
/// rate's).
pub fn services(count: usize, server: Ipv4Addr) -> Vec<Service> {
    let mut all: Vec<Service> = (0..count.saturating_sub(1))
        .map(|i| {
            let name = format!("bench/other-{i}:http");
            Service::new(&name, Protocol::Tcp, SocketAddrV4::new(other_ip(i), OTHER_PORT), &other_endpoints(i))
        })
        .collect();
    let ports = [
        ("iperf", Protocol::Tcp, iperf::PORT),
        ("iperf-udp", Protocol::Udp, iperf::PORT),
        ("sockperf", Protocol::Tcp, sockperf::PORT),
        ("sockperf-udp", Protocol::Udp, sockperf::PORT),
        ("connect", Protocol::Tcp, CONN_PORT),
    ];
    all.extend(ports.into_iter().map(|(name, protocol, port)| {
        let endpoint = SocketAddrV4::new(server, port);
        Service::new(&format!("bench/server:{name}"), protocol, SocketAddrV4::new(CLUSTER_IP, port), &[endpoint])
    }));
    all
}

/// `service-set --from-file`'s input for `services`.
fn file(services: &[Service]) -> Value {
    let entries: Vec<Value> = services
        .iter()
        .map(|s| {
            let protocol = if s.protocol == Protocol::Tcp { "tcp" } else { "udp" };
            let backends: Vec<String> = s.endpoints.iter().map(ToString::to_string).collect();
            json!({ "frontend": format!("{}:{}", s.cluster_ip, s.port), "protocol": protocol, "backends": backends })
        })
        .collect();
    Value::Array(entries)
}

/// Writes `services` into the socket LB's maps of `tb`'s network (its datapath loaded).
pub fn write_to_maps(tb: &Testbed, services: &[Service]) -> Result<()> {
    let path = tb.data_dir().with_file_name("services.json");
    std::fs::write(&path, file(services).to_string())?;
    let out = std::process::Command::new(&tb.plugin.binary)
        .args(["service-set", "--network", &tb.network, "--bpffs-root"])
        .arg(tb.bpffs_root())
        .arg("--from-file")
        .arg(&path)
        .output()
        .context("running ebpf-cni service-set")?;
    ensure!(out.status.success(), "service-set --from-file: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_service_comes_last_and_nothing_repeats() {
        let all = services(1000, Ipv4Addr::new(10, 242, 0, 3));
        assert_eq!(all.len(), 999 + 5);
        assert!(all[999..].iter().all(|s| s.cluster_ip == CLUSTER_IP));
        let mut frontends: Vec<_> = all.iter().map(|s| (s.cluster_ip, s.port, s.protocol == Protocol::Tcp)).collect();
        frontends.sort();
        frontends.dedup();
        assert_eq!(frontends.len(), all.len());
        assert_eq!(
            file(&all[..1])[0],
            json!({"frontend": "10.97.0.1:80", "protocol": "tcp",
            "backends": ["10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"]})
        );
    }
}
