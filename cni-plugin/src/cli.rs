//! The binary run by hand (no CNI_COMMAND in the environment).
use std::{
    io::{ErrorKind, Write as _},
    process::ExitCode,
};

use clap::{Parser, Subcommand};

use crate::cni::version;

#[derive(Parser)]
#[command(name = "ebpf-cni", version, about = "CNI plugin with an eBPF datapath (veth + TC, no bridge, no iptables)")]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(Subcommand)]
enum Sub {
    /// Print the CNI spec versions this plugin speaks.
    CniVersions,
    /// Show what a network's datapath holds: endpoints, NAT, drop counters, programs, logs.
    Inspect(crate::inspect::Inspect),
    /// Install this binary into <root>/opt/cni/bin and write <root>/etc/cni/net.d/10-ebpf-cni.conflist.
    Install(crate::install::Install),
    /// Print every network's datapath figures (drops, endpoints, NAT) once, in the Prometheus
    /// text format; `agent --metrics-addr` serves the same.
    Metrics(crate::metrics::Metrics),
    /// Keep routes to the other nodes' pod CIDRs (host-gw) in step with the cluster's nodes (watched);
    /// routes it did not make are never changed.
    Agent(crate::agent::Agent),
    /// Writes one Service into a network's socket LB maps (tests and debugging; the agent
    /// writes them from the API server).
    #[command(hide = true)]
    ServiceSet(crate::bpf::services::cli::ServiceSet),
    /// Compiles a file's Namespaces, Pods and NetworkPolicies into a network's policy maps once
    /// (tests and debugging; the agent does it from the API server).
    #[command(hide = true)]
    PolicySet(crate::agent::PolicySet),
}

pub fn run() -> ExitCode {
    match Cli::parse().command {
        Some(Sub::CniVersions) => {
            let versions = format!("{}\n", version::SUPPORTED.join(" "));
            report(write_stdout(&versions).map(drop).map_err(Into::into))
        }
        Some(Sub::Inspect(args)) => report(crate::inspect::run(args)),
        Some(Sub::Metrics(args)) => report(crate::metrics::run(args)),
        Some(Sub::Install(args)) => report(crate::install::run(args)),
        Some(Sub::ServiceSet(args)) => {
            crate::logging::init();
            report(crate::bpf::services::cli::run(args))
        }
        Some(Sub::PolicySet(args)) => {
            crate::logging::init();
            report(crate::agent::policy_set(args))
        }
        Some(Sub::Agent(args)) => {
            crate::logging::init();
            report(crate::agent::run(args))
        }
        None => {
            eprintln!("ebpf-cni is run by a container runtime with CNI_COMMAND set; see --help");
            ExitCode::from(2)
        }
    }
}

fn report(outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ebpf-cni: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes to stdout; `Ok(false)` once the reader has gone. `ebpf-cni inspect … | head -1` closes
/// the pipe early: that ends the output quietly, as for any Unix filter, where `println!` would
/// panic (Rust ignores SIGPIPE, so the write fails instead). The CNI verbs never get here: they
/// keep reporting every failure as error JSON.
pub fn write_stdout(text: &str) -> std::io::Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}
