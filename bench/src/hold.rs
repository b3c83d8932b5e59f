//! `--hold PATH`: builds one pod → pod path as the datapath or the cross-node section does, prints its namespaces
//! and server address, and keeps it until Enter (or end of input), for looking at it with other
//! tools meanwhile (perf, bpftool, ethtool, a hand-run iperf3 or `--conn-client`).
//! `--hold policy` and `--hold no-policy`: the NetworkPolicy section's nodes, with its 1,000
//! policies and without, serving its connection rate's server.
use std::io::BufRead as _;

use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{
    topology::{self, Family, Path},
    two_nodes,
};

/// `cross`: the path across two nodes. `policies`: the NetworkPolicy section's node with that
/// many policies (`path` is then ebpf-cni).
pub fn run(path: Path, cross: bool, policies: Option<usize>, ours: &Plugin) -> Result<()> {
    let pair = match policies {
        Some(policies) => crate::policy::node(ours, policies)?,
        None if cross => two_nodes::build(path, ours)?,
        None => topology::build(path, ours, Family::V4)?,
    };
    println!("path {}", path.name());
    println!("client_ns {}", pair.client_ns);
    println!("server_ns {}", pair.server_ns);
    println!("server_ip {}", pair.server_ip);
    if let Some(node) = pair.node() {
        println!("node_ns {}", node.node.name);
        println!("pins {}", node.loaded_version_dir().display());
    }
    if policies.is_some() {
        // The connection rate's server, for a hand-run `--conn-client` (on the ping-pong's CPU).
        let listen = std::net::SocketAddrV4::new(pair.server_ip.parse()?, crate::service_set::CONN_PORT);
        let listener = ebpf_cni_tests::traffic::tcp_listener(&pair.server_ns, listen)?;
        // Never stopped: the process ends with the hold.
        let never = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        crate::conn_rate::answer_each(listener, Some(crate::sockperf::LATENCY_CPU), never);
        println!("serving {listen}");
    }
    println!("kept until Enter");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}
