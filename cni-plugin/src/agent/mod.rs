//! `ebpf-cni agent`: keeps the node's routes to the other nodes' pod CIDRs (host-gw: each
//! via that node's InternalIP of the same family, which must be on a shared L2 segment; IPv4
//! and, on dual-stack nodes, IPv6) in step with the cluster's Node objects, watched on the API
//! server. Routes stay when the agent stops, so pods keep
//! working through an agent restart or upgrade. With a node file naming the primary network,
//! it also keeps that network's datapath loaded ahead of its first pod (`preload.rs`), and
//! against an API server enforces the cluster's NetworkPolicies on it (`policy.rs`) unless the
//! node file says `"networkPolicy": false`.
mod plan;
mod policy;
mod policy_set;
mod policy_sink;
mod policy_stats;
mod preload;
mod service_maps;
mod service_stats;
mod services;
mod settling;
mod stats;
mod sync;
mod watch;

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Arc, mpsc::channel},
    thread::sleep,
    time::Duration,
};

use anyhow::Result;
use clap::Args;
use nix::sys::signal::{SigSet, Signal};

use crate::{
    cni::{config::DEFAULT_BPFFS_ROOT, node_conf},
    kube::{self, NodeExt as _},
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
    /// With kubeProxyReplacement: write the Service model (frontends, backends, counts) as JSON
    /// to this file whenever it changed and the input is quiet (tests, debugging).
    #[arg(long, hide = true)]
    services_dump: Option<PathBuf>,
    /// Where NetworkPolicy's names for `ebpf-cni monitor` are written (slots, identities, pods).
    #[arg(long, default_value = crate::policy::DEFAULT_NAMES_PATH)]
    policy_names: PathBuf,
}

pub use policy_set::{PolicySet, run as policy_set};

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
    let service_stats = Arc::new(service_stats::ServiceStats::default());
    let policy_stats = Arc::new(policy_stats::PolicyStats::default());
    if let Some(addr) = args.metrics_addr {
        let (root, stats, service_stats) = (args.bpffs_root.clone(), Arc::clone(&stats), Arc::clone(&service_stats));
        let policy_stats = Arc::clone(&policy_stats);
        let at = crate::metrics::serve(addr, move || {
            let mut page = crate::metrics::Exposition::default();
            stats.write(&mut page);
            service_stats.write(&mut page);
            policy_stats.write(&mut page);
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
        let changes = syncer.sync(&list.iter().collect::<Vec<_>>(), &mut BTreeSet::new(), None)?;
        sync::log_changes(&changes);
        let failures = &changes.failures;
        anyhow::ensure!(failures.is_empty(), "{} routes could not be set: {}", failures.len(), failures.join("; "));
        return Ok(());
    }
    let primary_pins = preload.as_ref().map(|p| p.pins());
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
    let kube_proxy_replacement = kube_proxy_replacement(&args.node_conf);
    if kube_proxy_replacement && args.source.in_cluster() {
        log::warn!(
            "kubeProxyReplacement with the in-cluster API address, a ClusterIP: without kube-proxy only this agent \
             makes it reachable, so after a reboot it cannot list the Services it needs; give --api-server the API \
             server's own address"
        );
    }
    if let Some(target) = args.source.target() {
        let mut feed = kube::Feed::new(target, interval)?;
        let (nodes, updates) = channel();
        feed.watch(nodes, |update| update);
        let policy = network_policy(&args.node_conf, &args.bpffs_root)
            .map(|(root, network)| policy::start(&mut feed, root, network, args.policy_names, policy_stats));
        let services = kube_proxy_replacement
            .then(|| services::start(&mut feed, &args.node, args.services_dump, primary_pins, service_stats));
        feed.start();
        let mut addrs = Vec::new();
        watch::run(&updates, &syncer, interval, |node| {
            let now: Vec<IpAddr> = [node.internal_ipv4().map(IpAddr::from), node.internal_ipv6().map(IpAddr::from)]
                .into_iter()
                .flatten()
                .collect();
            if now != addrs {
                addrs.clone_from(&now);
                if let Some(services) = &services {
                    let _ = services.send(services::Input::NodeAddrs(now.clone()));
                }
                if let Some(policy) = &policy {
                    let _ = policy.send(policy::Input::NodeAddrs(now));
                }
            }
        });
        anyhow::bail!("the watch of the API server stopped");
    }
    if kube_proxy_replacement {
        log::warn!("kubeProxyReplacement needs the API server (Services, EndpointSlices): not with --nodes-file");
    }
    // A file has no watch: it is read again every interval. A read that fails removes nothing.
    loop {
        match args.source.list() {
            Ok(list) => syncer.sync_logged(&list.iter().collect::<Vec<_>>(), &mut BTreeSet::new(), None),
            Err(e) => log::error!("reading the nodes failed: {e:#}; no route removed"),
        }
        sleep(interval);
    }
}

/// Where NetworkPolicy is enforced: the node file's primary network (its `bpffsRoot`, else
/// `root`), unless the file says `"networkPolicy": false` (an unreadable node file is logged
/// where the preload reads it).
fn network_policy(path: &Path, root: &Path) -> Option<(PathBuf, String)> {
    let node = node_conf::NodeConf::load(path).ok().flatten();
    if node.as_ref().and_then(|n| n.network_policy) == Some(false) {
        log::info!("networkPolicy is false in the node file: NetworkPolicy is not enforced");
        return None;
    }
    let Some(network) = node.as_ref().and_then(|n| n.primary_network.clone()) else {
        log::warn!("network policy: the node file names no primaryNetwork: no NetworkPolicy is enforced");
        return None;
    };
    let root = node.and_then(|n| n.bpffs_root).unwrap_or_else(|| root.to_path_buf());
    Some((root, network))
}

/// The node file's `kubeProxyReplacement` (off without a node file, or with one that cannot be
/// read: that is logged where the preload reads it too).
fn kube_proxy_replacement(path: &Path) -> bool {
    let on = node_conf::NodeConf::load(path).ok().flatten().and_then(|n| n.kube_proxy_replacement).unwrap_or(false);
    if on {
        log::info!("kubeProxyReplacement: serving Services from the API server's Services and EndpointSlices");
    }
    on
}
