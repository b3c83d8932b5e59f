//! `ebpf-cni service-set` (hidden): Services into a network's maps through the writer, as the
//! agent writes them, for tests, the bench and trying the socket LB by hand. One Service from
//! the flags, or many from `--from-file` (one process and one open of the maps for all of them:
//! the bench fills the maps with 10,000 Services, which one process per Service takes minutes
//! to do). Prints what settling the removed backends' sockets did, as JSON.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;
use serde::Deserialize;

use super::{Exposure, Frontend, Protocol, ServiceWriter};
use crate::{bpf::read, cni::config::DEFAULT_BPFFS_ROOT};

#[derive(Args)]
pub struct ServiceSet {
    #[arg(long, short)]
    network: String,
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// The Service's address and port (`10.96.0.10:53`, `[fd00::a]:80`).
    #[arg(long, required_unless_present = "from_file")]
    frontend: Option<SocketAddr>,
    #[arg(long, default_value = "tcp")]
    protocol: Protocol,
    /// A backend (`10.1.0.5:8053`); repeat for more; none: the Service has no endpoint.
    #[arg(long = "backend")]
    backends: Vec<SocketAddr>,
    /// `sessionAffinity: ClientIP` with this timeout in seconds.
    #[arg(long)]
    affinity_seconds: Option<u64>,
    /// Reached per packet from the LAN too (a LoadBalancer IP, an externalIP); a frontend
    /// `0.0.0.0:<port>` (`[::]:<port>`) is a NodePort on the node's address, always external.
    #[arg(long)]
    external: bool,
    /// `externalTrafficPolicy: Local` (the backends given are this node's).
    #[arg(long)]
    local: bool,
    /// Remove the Service instead.
    #[arg(long, conflicts_with = "backends")]
    remove: bool,
    /// Many Services at once: a JSON array of `{"frontend": "10.96.0.10:80", "protocol": "tcp",
    /// "backends": ["10.1.0.5:8080"], "affinitySeconds": 60}` (protocol, backends and affinity
    /// optional), each upserted in order.
    #[arg(long, conflicts_with_all = ["frontend", "backends", "remove", "affinity_seconds"])]
    from_file: Option<PathBuf>,
}

/// One Service of a `--from-file` list.
#[derive(Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    frontend: SocketAddr,
    #[serde(default = "tcp")]
    protocol: Protocol,
    #[serde(default)]
    backends: Vec<SocketAddr>,
    affinity_seconds: Option<u64>,
}

fn tcp() -> Protocol {
    Protocol::Tcp
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

pub fn run(args: ServiceSet) -> anyhow::Result<()> {
    let pins = read::pinned(&args.bpffs_root, &args.network)?;
    let mut writer = ServiceWriter::open(&pins)?;
    let removals = match (&args.from_file, args.frontend) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            let entries: Vec<Entry> = serde_json::from_str(&text).with_context(|| format!("{}", file.display()))?;
            let mut removals = Vec::new();
            for e in entries {
                let frontend = Frontend { ip: e.frontend.ip(), port: e.frontend.port(), protocol: e.protocol };
                let affinity = e.affinity_seconds.map(Duration::from_secs);
                removals.push(writer.upsert(frontend, &e.backends, affinity).with_context(|| e.frontend.to_string())?);
            }
            removals
        }
        (None, Some(address)) => {
            let frontend = Frontend { ip: address.ip(), port: address.port(), protocol: args.protocol };
            let affinity = args.affinity_seconds.map(Duration::from_secs);
            let exposure = Exposure { external: args.external, local: args.local };
            let removal = if args.remove {
                writer.remove(frontend)?.with_context(|| format!("no Service {address} {:?}", args.protocol))?
            } else if exposure == Exposure::default() {
                writer.upsert(frontend, &args.backends, affinity)?
            } else {
                writer.upsert_exposed(frontend, &args.backends, affinity, exposure)?
            };
            vec![removal]
        }
        (None, None) => anyhow::bail!("--frontend or --from-file"),
    };
    let settled = writer.settle(&removals)?;
    crate::cli::write_stdout(&format!("{}\n", serde_json::to_string(&settled)?))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_lists_services_with_defaults() {
        let text = r#"[{"frontend": "10.96.0.10:80", "backends": ["10.1.0.5:8080"]},
                       {"frontend": "[fd00::a]:53", "protocol": "UDP", "affinitySeconds": 60}]"#;
        let entries: Vec<Entry> = serde_json::from_str(text).unwrap();
        let first = Entry {
            frontend: "10.96.0.10:80".parse().unwrap(),
            protocol: Protocol::Tcp,
            backends: vec!["10.1.0.5:8080".parse().unwrap()],
            affinity_seconds: None,
        };
        assert_eq!(entries[0], first);
        assert_eq!(
            (entries[1].protocol, entries[1].backends.len(), entries[1].affinity_seconds),
            (Protocol::Udp, 0, Some(60))
        );
        let typo = r#"[{"frontend": "10.96.0.10:80", "backend": ["10.1.0.5:8080"]}]"#;
        assert!(serde_json::from_str::<Vec<Entry>>(typo).is_err(), "an unknown field is refused");
        assert!(serde_json::from_str::<Vec<Entry>>(r#"[{"frontend": "10.96.0.10:80", "protocol": "sctp"}]"#).is_err());
    }
}
