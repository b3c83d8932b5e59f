//! `--hold PATH`: builds one pod → pod path as the datapath or the cross-node section does, prints its namespaces
//! and server address, and keeps it until Enter (or end of input), for looking at it with other
//! tools meanwhile (perf, bpftool, ethtool, a hand-run iperf3).
use std::io::BufRead as _;

use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{
    topology::{self, Family, Path},
    two_nodes,
};

/// `cross`: the path across two nodes.
pub fn run(path: Path, cross: bool, ours: &Plugin) -> Result<()> {
    let pair = if cross { two_nodes::build(path, ours)? } else { topology::build(path, ours, Family::V4)? };
    println!("path {}", path.name());
    println!("client_ns {}", pair.client_ns);
    println!("server_ns {}", pair.server_ns);
    println!("server_ip {}", pair.server_ip);
    if let Some(node) = pair.node() {
        println!("node_ns {}", node.node.name);
        println!("pins {}", node.loaded_version_dir().display());
    }
    println!("kept until Enter");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}
