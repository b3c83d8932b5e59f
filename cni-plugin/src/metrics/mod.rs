//! `ebpf-cni metrics`, and what the agent serves on `--metrics-addr`: every network's datapath
//! figures in the Prometheus text format, read from its pins on each call. Reading changes
//! nothing: counters are never reset, the log ring buffer is never read.
mod exposition;
mod serve;
mod sync_latency;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use ebpf_common::{
    Counter, DropReason, ENDPOINTS_MAX_ENTRIES, Endpoint, FlowKey, ForwardPath, IpKey, NAT_MAX_ENTRIES, NatEntry, names,
};
pub use exposition::Exposition;
pub use serve::spawn as serve;
pub use sync_latency::SyncLatency;

use crate::{
    bpf::{Pins, read},
    cni::config::DEFAULT_BPFFS_ROOT,
};

#[derive(Args)]
pub struct Metrics {
    /// The configuration's `bpffsRoot`.
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// Only this network (the configuration's `name`). Default: every network under the root.
    #[arg(long, short)]
    network: Option<String>,
}

/// Prints the page once. Fails, saying why, when there is nothing to read: no network under the
/// root, or the named network has no pins. Of several networks, one that cannot be read is
/// `ebpf_cni_up 0` (and a line on stderr), as the agent serves it.
pub fn run(args: Metrics) -> Result<()> {
    let root = &args.bpffs_root;
    let named = args.network.is_some();
    let networks = match args.network {
        Some(name) => vec![name],
        None => read::networks(root)?,
    };
    if networks.is_empty() {
        bail!("no network under {}: no pod has been added yet", root.display());
    }
    let mut page = Exposition::default();
    for network in &networks {
        match write_network(&mut page, root, network) {
            Err(e) if named => return Err(e),
            Err(e) => eprintln!("ebpf-cni: network {network:?}: {e:#} (ebpf_cni_up 0)"),
            Ok(()) => {}
        }
    }
    // `ebpf-cni metrics | head -1`: a reader gone early ends the output quietly.
    crate::cli::write_stdout(&page.render()).context("writing to stdout")?;
    Ok(())
}

/// Every network's series under `root`, for a scrape: a network that cannot be read is
/// `ebpf_cni_up 0`; a root that is missing or empty adds nothing.
pub fn write_networks(page: &mut Exposition, root: &Path) {
    for network in read::networks(root).unwrap_or_default() {
        if let Err(e) = write_network(page, root, &network) {
            log::debug!("metrics: network {network:?}: {e:#}");
        }
    }
}

/// `ebpf_cni_up` for `network`, and its other series when its pins could be read.
fn write_network(page: &mut Exposition, root: &Path, network: &str) -> Result<()> {
    let figures = read::pinned(root, network).and_then(|pins| Figures::read(&pins));
    page.gauge(
        "ebpf_cni_up",
        "1 when the network's pins could be read; 0 when not, and then it has no other series.",
        &[("network", network)],
        u64::from(figures.is_ok()),
    );
    figures?.write(page, network);
    Ok(())
}

/// What one network's pins say, read before anything is written: a network shows all of its
/// series or none.
struct Figures {
    drops: Vec<(DropReason, Counter)>,
    forwarded: Option<Vec<(ForwardPath, Counter)>>,
    endpoints: usize,
    nat_entries: usize,
    loaded_at: Option<u64>,
    layout_version: u32,
    services: Option<read::ServiceFigures>,
    map_memory: Vec<(String, u64)>,
}

impl Figures {
    fn read(pins: &Pins) -> Result<Self> {
        Ok(Self {
            drops: read::drop_counters(pins)?,
            forwarded: read::forwarded_counters(pins)?,
            endpoints: read::count_entries::<IpKey, Endpoint>(pins, names::ENDPOINTS)?,
            nat_entries: read::count_entries::<FlowKey, NatEntry>(pins, names::NAT)?,
            loaded_at: read::loaded_at(pins)?,
            layout_version: pins.version(),
            services: read::service_figures(pins)?,
            map_memory: read::map_memory(pins)?,
        })
    }

    /// The network's series. A new datapath figure is one more field read in [`Figures::read`]
    /// and written here.
    fn write(&self, page: &mut Exposition, network: &str) {
        let net = [("network", network)];
        for &(reason, sum) in &self.drops {
            let labels = [("network", network), ("reason", reason.name())];
            page.counter(
                "ebpf_cni_drops_total",
                "Packets the datapath dropped, by reason (as `ebpf-cni inspect counters` names them), summed over CPUs.",
                &labels,
                sum.packets,
            );
            page.counter(
                "ebpf_cni_dropped_bytes_total",
                "Bytes of the packets the datapath dropped (whole frames), by reason, summed over CPUs.",
                &labels,
                sum.bytes,
            );
        }
        for &(path, sum) in self.forwarded.iter().flatten() {
            let labels = [("network", network), ("path", path.name())];
            page.counter(
                "ebpf_cni_forwarded_packets_total",
                "Packets the datapath let through, by the path they took (pod-to-pod: bpf_redirect_peer; \
                 to-other-node: FIB redirect; to-stack: handed to the node's stack; masqueraded; \
                 reply-to-pod: a masqueraded flow's reply, straight into its pod), summed over CPUs.",
                &labels,
                sum.packets,
            );
            page.counter(
                "ebpf_cni_forwarded_bytes_total",
                "Bytes of the packets the datapath let through, by path, summed over CPUs.",
                &labels,
                sum.bytes,
            );
        }
        let exhausted = self.drops.iter().find(|(r, _)| *r == DropReason::NatPortsExhausted);
        page.counter(
            "ebpf_cni_nat_port_claim_failures_total",
            "New masqueraded flows whose packet was dropped because no port was free for their destination \
             (every try taken by a live flow); the same counter as ebpf_cni_drops_total{reason=\"nat-ports-exhausted\"}.",
            &net,
            exhausted.map_or(0, |(_, c)| c.packets),
        );
        page.gauge("ebpf_cni_endpoints", "Pod addresses on this node (entries of ENDPOINTS).", &net, self.endpoints);
        page.gauge(
            "ebpf_cni_endpoints_capacity_entries",
            "Size of ENDPOINTS: ADD fails (code 105) once ebpf_cni_endpoints reaches it.",
            &net,
            ENDPOINTS_MAX_ENTRIES,
        );
        page.gauge(
            "ebpf_cni_nat_entries",
            "Entries of the NAT map: two per masqueraded flow (egress and reply).",
            &net,
            self.nat_entries,
        );
        page.gauge(
            "ebpf_cni_nat_capacity_entries",
            "Size of the NAT map; an LRU map, which forgets the least recently used flows when full.",
            &net,
            NAT_MAX_ENTRIES,
        );
        page.gauge(
            "ebpf_cni_datapath_layout_version",
            "Layout version of the pins read (the v<N> of their path in bpffs).",
            &net,
            self.layout_version,
        );
        if let Some(services) = &self.services {
            write_services(page, network, services);
        }
        for (map, bytes) in &self.map_memory {
            page.gauge(
                "ebpf_cni_map_memory_bytes",
                "Kernel memory each pinned map holds (memlock: all entries of a preallocated map, what is \
                 allocated of the others).",
                &[("network", network), ("map", map.as_str())],
                *bytes,
            );
        }
        if let Some(at) = self.loaded_at {
            page.gauge(
                "ebpf_cni_datapath_loaded_timestamp_seconds",
                "When the network's programs were loaded (the pinned from_pod program's load time), Unix seconds.",
                &net,
                at,
            );
        }
    }
}

/// The socket LB's series (with `kubeProxyReplacement`).
fn write_services(page: &mut Exposition, network: &str, services: &read::ServiceFigures) {
    let net = [("network", network)];
    for &(event, count) in &services.events {
        page.counter(
            "ebpf_cni_service_translations_total",
            "What the socket LB did, by event: connect and sendmsg sent to a backend, recvmsg and getpeername \
             shown the frontend, affinity-hit a ClientIP client given its previous backend; summed over CPUs. \
             Refusals (no endpoint) are ebpf_cni_drops_total{reason=\"service-no-endpoint\"}.",
            &[("network", network), ("event", event.name())],
            count,
        );
    }
    page.gauge("ebpf_cni_service_frontends", "Service frontends in SVC_FRONTENDS.", &net, services.frontends);
    page.gauge(
        "ebpf_cni_service_affinity_entries",
        "ClientIP affinity entries in SVC_AFFINITY (an LRU map).",
        &net,
        services.affinity_entries,
    );
}
