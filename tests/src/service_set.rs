//! `ebpf-cni service-set` on a LAN node's network: the test-only writer of the socket LB's maps
//! (the agent's, without the API server), and what settling the sockets of removed backends did.
use std::{net::SocketAddr, process::Command};

use serde_json::Value;

use crate::lan::Lan;

/// Sets `frontend`'s backends on node `node` (`extra`: further flags such as `--remove`);
/// returns the command's JSON (`reconnected`, `destroyed`).
pub fn service_set(
    lan: &Lan,
    node: usize,
    frontend: &str,
    protocol: &str,
    backends: &[String],
    extra: &[&str],
) -> Value {
    let tb = &lan.nodes[node];
    let mut command = Command::new(&tb.plugin.binary);
    command.args(["service-set", "--network", &tb.network, "--bpffs-root"]).arg(tb.bpffs_root());
    command.args(["--frontend", frontend, "--protocol", protocol]).args(extra);
    for backend in backends {
        command.args(["--backend", backend]);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "service-set {frontend}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `ip:port` as `service-set` takes it (`[ip6]:port` for IPv6).
pub fn at(ip: impl std::fmt::Display, port: u16) -> String {
    SocketAddr::new(ip.to_string().parse().unwrap(), port).to_string()
}
