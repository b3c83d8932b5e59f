//! The first ADD on a fresh node: what kubelet waits for when a node's first pod starts, or a
//! network's first pod after its last one left. For ebpf-cni that is loading and pinning the
//! datapath and attaching the uplink programs; for bridge, creating the bridge and its iptables
//! chains. Twice for ebpf-cni: the plugin alone, and as the DaemonSet runs it, where the agent
//! loaded the datapath ahead (`Node::preload`, not timed: it runs before any pod is scheduled).
//! Every sample is a new node (namespace, bpffs, data dir) built and torn down around one ADD;
//! the plugins take turns round by round.
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

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let name = "first ADD on a fresh node p50";
    // Without the agent the verifier and the flow tables' preallocation stay in the first ADD.
    let mut alone =
        Figure::new("control plane", format!("{name}, plugin alone"), "ms", Lower).target(Some(Path::Bridge), 1.0);
    let mut preloaded =
        Figure::new("control plane", format!("{name}, datapath loaded ahead by the agent"), "ms", Lower)
            .target(Some(Path::Bridge), 1.0);
    for round in 0..s.rounds {
        for path in topology::rotated(Path::PLUGINS, round) {
            let ways: &[bool] = if path == Path::EbpfCni { &[false, true] } else { &[false] };
            for &preload in ways {
                let mut samples = Samples::default();
                for _ in 0..NODES_PER_ROUND {
                    let mut node = Node::new(path, ours)?;
                    if preload {
                        node.preload()?;
                    }
                    crate::cpu::wait_idle()?;
                    let (pod, ms) = node.add()?;
                    samples.push(ms);
                    node.del(pod)?;
                }
                let how = if preload { " (agent)" } else { "" };
                eprintln!("control first ADD round {round} {:8}{how}: p50 {:.1} ms", path.name(), samples.median());
                let figure = if preload { &mut preloaded } else { &mut alone };
                figure.record(path, samples.median());
                if path == Path::Bridge {
                    // The same bridge samples are the reference of both figures.
                    preloaded.record(path, samples.median());
                }
            }
        }
    }
    Ok(vec![preloaded, alone])
}
