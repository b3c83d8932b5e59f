//! The command line of `ebpf-cni monitor`.
use std::{path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use ebpf_common::MONITOR_DEFAULT_RATE;

use crate::cni::config::DEFAULT_BPFFS_ROOT;

#[derive(Args)]
pub struct Monitor {
    /// The network (the configuration's `name`).
    #[arg(long, short)]
    pub network: String,
    /// The configuration's `bpffsRoot`.
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,
    /// The agent's names file: pods, policies and identities by address and slot. Without it
    /// pods and peers show as addresses and policies as slot numbers.
    #[arg(long, default_value = crate::policy::DEFAULT_NAMES_PATH)]
    pub policy_names: PathBuf,
    /// Events involving this pod (as the pod or the peer): `namespace/name` or an address.
    #[arg(long)]
    pub pod: Option<String>,
    /// Events involving a pod of this namespace (as the pod or the peer).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only these verdicts (repeatable).
    #[arg(long, value_enum)]
    pub verdict: Vec<Verdict>,
    /// Only drops (any reason but a policy's), or only policy verdicts.
    #[arg(long = "type", value_enum)]
    pub kind: Option<Kind>,
    /// Events per second per CPU the programs may write; the rest are counted as lost.
    #[arg(long, default_value_t = MONITOR_DEFAULT_RATE)]
    pub rate: u32,
    /// Exit after printing this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Exit after this long (`30s`, `5m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    #[arg(long, short, value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Verdict {
    /// Dropped by the datapath for a reason of its own (spoofed source, malformed, …).
    Dropped,
    /// A new flow no policy allowed (dropped).
    Denied,
    /// A new flow a policy allowed.
    Allowed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Drop,
    Policy,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One line per event, in columns.
    #[default]
    Table,
    /// One JSON object per line.
    Json,
}
