//! `ebpf-cni policy-set` (hidden): compiles the Namespaces, Pods and NetworkPolicies of a file
//! and writes a network's policy maps once, through the agent's own compiler and sink (tests,
//! the bench, trying policies by hand without an API server). Prints what it wrote as JSON.
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use serde_json::json;

use super::policy_sink::{PolicySink, Written};
use crate::{
    bpf::{policy_maps, read},
    cni::config::DEFAULT_BPFFS_ROOT,
    policy::{Compiler, InputFile},
};

#[derive(Args)]
pub struct PolicySet {
    #[arg(long, short)]
    network: String,
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// `{"namespaces": [..], "pods": [..], "networkPolicies": [..], "nodeAddresses": [..]}`, each
    /// object in the API's JSON. The node's pods are those of `ENDPOINTS`; the node's addresses
    /// are the datapath's too.
    #[arg(long)]
    input: PathBuf,
    /// Also write the monitor's names file here.
    #[arg(long)]
    policy_names: Option<PathBuf>,
}

pub fn run(args: PolicySet) -> anyhow::Result<()> {
    let pins = read::pinned(&args.bpffs_root, &args.network)?;
    let text = std::fs::read_to_string(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let file: InputFile = serde_json::from_str(&text).with_context(|| format!("{}", args.input.display()))?;
    let mut input = file.into_input();
    input.locals = policy_maps::local_pods(&pins)?;
    input.node_addrs.extend(policy_maps::node_addrs(&pins)?);
    let mut compiler = Compiler::default();
    let compiled = compiler.compile(&input);
    for problem in &compiled.problems {
        log::warn!("network policy: {problem}");
    }
    let mut sink = PolicySink::new(&args.bpffs_root, &args.network);
    let Written::Applied { changes, applied, took } = sink.write(&compiled, &compiler.take_new_slots()) else {
        bail!("network {:?}: its datapath was loaded without FEATURE_POLICY: nothing written", args.network);
    };
    if let Some(path) = &args.policy_names {
        compiled.names.write(path).with_context(|| format!("writing {}", path.display()))?;
    }
    let summary = json!({
        "policies": compiled.policies,
        "identities": compiled.identities.len(),
        "endpoints": compiled.endpoints.len() + compiled.endpoints_by_ifindex.len(),
        "endpoints_by_ifindex": compiled.endpoints_by_ifindex.len(),
        "rules": compiled.rules.len(),
        "changes": changes,
        "failed": applied.failed,
        "microseconds": took.as_micros() as u64,
        "problems": compiled.problems,
        "slots": compiler.slots().map(|((ns, name), slot)| (format!("{ns}/{name}"), slot)).collect::<std::collections::BTreeMap<_, _>>(),
    });
    crate::cli::write_stdout(&format!("{summary}\n"))?;
    if applied.failed > 0 {
        bail!("{} map writes failed: {}", applied.failed, applied.first_error.unwrap_or_default());
    }
    Ok(())
}
