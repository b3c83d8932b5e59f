//! `ebpf-cni agent`: keeps the node's routes to the other nodes' pod CIDRs (host-gw: each
//! via that node's InternalIP of the same family, which must be on a shared L2 segment; IPv4
//! and, on dual-stack nodes, IPv6) in step with the cluster's Node objects, watched on the API
//! server. Routes stay when the agent stops, so pods keep
//! working through an agent restart or upgrade. With a node file naming the primary network,
//! it also keeps that network's datapath loaded ahead of its first pod (`preload.rs`).
mod plan;
mod preload;
mod stats;
mod sync;
mod watch;

use std::{collections::BTreeSet, net::SocketAddr, path::PathBuf, sync::Arc, thread::sleep, time::Duration};

use anyhow::Result;
use clap::Args;
use nix::sys::signal::{SigSet, Signal};

use crate::{
    cni::{config::DEFAULT_BPFFS_ROOT, node_conf},
    kube,
};

#[derive(Args)]
pub struct Agent {
    /// This node's name (the DaemonSet passes spec.nodeName): its own pod CIDR gets no route,
    /// and a node list without it removes no route.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    #[command(flatten)]
    source: kube::Source,
    /// Seconds each watch of the API server lasts (timeoutSeconds); when one ends, the routes
    /// are checked again and the watch goes on. With --nodes-file: seconds between two reads.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    interval: u64,
    /// List the nodes, set the routes once and exit (non-zero, saying why, if a route could not
    /// be set: an unreachable gateway, or a route the agent did not make in its place).
    #[arg(long)]
    once: bool,
    /// The plugin's `bpffsRoot`: bpffs is mounted on its parent at start when the node has
    /// none there yet, so that the first pod's ADD finds it (the DaemonSet mounts the host's
    /// /sys/fs/bpf with Bidirectional propagation, so the mount is the node's and outlives
    /// the agent).
    #[arg(long, default_value = DEFAULT_BPFFS_ROOT)]
    bpffs_root: PathBuf,
    /// Serve metrics in the Prometheus text format on http://HOST:PORT/metrics: the agent's syncs
    /// and every network's datapath figures under --bpffs-root, read at each scrape. Off unless
    /// given.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "once")]
    metrics_addr: Option<SocketAddr>,
    /// The node file (`ebpf-cni install` writes it): when it names the primary network and its
    /// pod CIDRs, that network's datapath is loaded ahead of its first pod, checked again every
    /// --interval, and unloaded on SIGTERM if no pod uses it.
    #[arg(long, env = node_conf::PATH_ENV, default_value = node_conf::DEFAULT_PATH)]
    node_conf: PathBuf,
}

pub fn run(args: Agent) -> Result<()> {
    crate::logging::configure(log::LevelFilter::Info, None);
    // Before any thread starts, so that all inherit the mask and one thread takes the signal
    // (a --once run keeps the default: it has nothing to undo).
    let stop = SigSet::from_iter([Signal::SIGTERM, Signal::SIGINT]);
    if !args.once {
        stop.thread_block()?;
    }
    match crate::bpf::mount_bpffs_if_missing(&args.bpffs_root) {
        Ok(Some(at)) => log::info!("bpffs was not mounted: mounted it on {}", at.display()),
        Ok(None) => {}
        // Routes matter all the same; the plugin tries again at the first ADD.
        Err(e) => log::error!("bpffs is not mounted for {} and cannot be: {e}", args.bpffs_root.display()),
    }
    let stats = Arc::new(stats::Stats::default());
    if let Some(addr) = args.metrics_addr {
        let (root, stats) = (args.bpffs_root.clone(), Arc::clone(&stats));
        let at = crate::metrics::serve(addr, move || {
            let mut page = crate::metrics::Exposition::default();
            stats.write(&mut page);
            crate::metrics::write_networks(&mut page, &root);
            page.render()
        })?;
        log::info!("serving metrics on http://{at}/metrics");
    }
    let syncer = sync::Syncer::new(&args.node, stats)?;
    let interval = Duration::from_secs(args.interval);
    let preload = preload::Preload::from_node_file(&args.node_conf).unwrap_or_else(|e| {
        log::error!("cannot read the node file: {e:#}; no datapath is loaded ahead");
        None
    });
    let preload = preload.map(Arc::new);
    if !args.once {
        // Before the first preload, so that a SIGTERM meanwhile waits for it, then undoes it.
        let preload = preload.clone();
        std::thread::spawn(move || {
            let signal = stop.wait();
            log::info!("stopping on {}", signal.map_or("a signal", Signal::as_str));
            match preload {
                Some(preload) => preload.unload_and_exit(),
                None => std::process::exit(0),
            }
        });
    }
    if let Some(preload) = &preload {
        preload.ensure_logged();
    }
    if args.once {
        let list = args.source.list()?;
        let changes = syncer.sync(&list.items.iter().collect::<Vec<_>>(), &mut BTreeSet::new(), None)?;
        sync::log_changes(&changes);
        let failures = &changes.failures;
        anyhow::ensure!(failures.is_empty(), "{} routes could not be set: {}", failures.len(), failures.join("; "));
        return Ok(());
    }
    if let Some(preload) = preload {
        // The last pod's DEL unloads the datapath: load it again before the next first pod. And
        // masquerade's shares are counted again from NAT (they only err high in between).
        std::thread::spawn(move || {
            loop {
                sleep(interval);
                preload.ensure_logged();
                preload.maintain_flows_logged();
            }
        });
    }
    if let Some(api) = args.source.api()? {
        watch::run(&api, &syncer, interval);
    }
    // A file has no watch: it is read again every interval. A read that fails removes nothing.
    loop {
        match args.source.list() {
            Ok(list) => syncer.sync_logged(&list.items.iter().collect::<Vec<_>>(), &mut BTreeSet::new(), None),
            Err(e) => log::error!("reading the nodes failed: {e:#}; no route removed"),
        }
        sleep(interval);
    }
}
