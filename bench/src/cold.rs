//! The first ADD on a fresh node: what kubelet waits for when a node's first pod starts, or a
//! network's first pod after its last one left. For ebpf-cni that is loading and pinning the
//! datapath and attaching the uplink programs; for bridge, creating the bridge and its iptables
//! chains. Every sample is a new node (namespace, bpffs, data dir) built and torn down around
//! one ADD; the plugins take turns round by round.
use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{
    Settings,
    control::Node,
    report::{Better::Lower, Figure},
    stats::Samples,
    topology::{self, Path},
};

/// Fresh nodes per plugin and round: a round's value is their median.
const NODES_PER_ROUND: usize = 3;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Figure> {
    let mut cold =
        Figure::new("control plane", "first ADD on a fresh node p50", "ms", Lower).target(Some(Path::Bridge), 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::PLUGINS, round) {
            let mut samples = Samples::default();
            for _ in 0..NODES_PER_ROUND {
                let mut node = Node::new(path, ours)?;
                crate::cpu::wait_idle()?;
                let (pod, ms) = node.add()?;
                samples.push(ms);
                node.del(pod)?;
            }
            eprintln!("control first ADD round {round} {:8}: p50 {:.1} ms", path.name(), samples.median());
            cold.record(path, samples.median());
        }
    }
    Ok(cold)
}
