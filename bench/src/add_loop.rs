//! `--add-loop PODS`: ebpf-cni's control-plane node (`control.rs`) with `PODS` pods on it, then
//! ADD and DEL of one more pod over and over for `--seconds`, printing each phase's start and
//! the loop's p50s: a steady load to look at with perf (`perf record -a -g --comm ebpf-cni`)
//! at one level and another, to see what an ADD spends more on as the node fills.
use anyhow::Result;
use ebpf_cni_tests::Plugin;

use crate::{control::Node, stats::Samples, topology::Path};

pub fn run(ours: &Plugin, pods: usize, seconds: u32) -> Result<()> {
    let mut node = Node::new(Path::EbpfCni, ours)?;
    for _ in 0..pods {
        node.add()?;
    }
    eprintln!("add-loop: {pods} pods on the node; ADD and DEL of one more for {seconds} s");
    let (mut adds, mut dels) = (Samples::default(), Samples::default());
    let started = std::time::Instant::now();
    while started.elapsed().as_secs() < u64::from(seconds) {
        let (pod, add) = node.add()?;
        adds.push(add);
        dels.push(node.del(pod)?);
    }
    eprintln!(
        "add-loop: {} cycles, ADD p50 {:.2} ms, DEL p50 {:.2} ms",
        adds.values().len(),
        adds.median(),
        dels.median()
    );
    Ok(())
}
