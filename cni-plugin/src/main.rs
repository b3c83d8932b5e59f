//! `ebpf-cni`: a CNI plugin whose datapath is eBPF. Run by a container runtime (CNI_COMMAND set)
//! it performs one CNI verb; run by hand it is a small CLI.
mod agent;
mod attachment;
mod bpf;
mod cli;
mod cmd;
mod cni;
mod fault;
mod inspect;
mod install;
mod ipam;
mod kube;
mod logging;
mod metrics;
mod net;
mod policy;
mod services;

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() { cmd::run() } else { cli::run() }
}
