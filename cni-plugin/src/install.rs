//! `ebpf-cni install`: puts this binary into the node's CNI bin dir, writes the node file (the
//! node-level settings every network configuration is held to, `cni/node_conf.rs`, with a
//! masquerading node's addresses read once here) and then the
//! node's conflist from its pod CIDRs (IPv4, IPv6 or both: one IPAM range set each). Each file is
//! written aside and renamed into place, so a runtime reading it at that moment sees the old
//! file or the new one, never half of one; a file that would not change is left alone (kubelet
//! reacts to every conflist write).
use std::{
    fs::{self, File},
    io::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde_json::{Value, json};

use crate::{
    cni::{
        config::NetConf,
        node_conf::{self, NodeConf},
    },
    ipam::Ipam,
    kube,
    net::netlink::Netlink,
};

/// The conflist's name: `10-` sorts it before most others, as kubelet uses the first one.
pub const CONFLIST: &str = "10-ebpf-cni.conflist";

#[derive(Args)]
pub struct Install {
    /// The host's root: `/` on a node, `/host` in the DaemonSet, any directory to try it out.
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// The node's pod CIDRs, at most one per family: `10.244.1.0/24`, or dual-stack
    /// `10.244.1.0/24,fd00:10:244:1::/64` (or the flag twice). Default: `spec.podCIDRs` of node
    /// `--node`, read from the API server.
    #[arg(long, value_delimiter = ',')]
    pod_cidr: Vec<IpNetwork>,
    /// The node whose pod CIDRs to read (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    #[command(flatten)]
    source: kube::Source,
    /// The pod addresses of all nodes (`clusterCIDR`), at most one CIDR per family, comma-separated
    /// as --pod-cidr. Default: the node's pod CIDR of each family.
    #[arg(long, value_delimiter = ',')]
    cluster_cidr: Vec<IpNetwork>,
    /// Masquerade traffic from pods to outside the cluster CIDR (`ipMasq`).
    #[arg(long)]
    masquerade: bool,
    /// The network name, as pins and IP reservations are filed under.
    #[arg(long, default_value = "ebpf-cni")]
    network: String,
    /// The interface masqueraded traffic leaves by (the node file's `uplink`). Default: that of
    /// the node's default route.
    #[arg(long)]
    uplink: Option<String>,
    /// Where every network's plugin log lines go (the node file's `logFile`). Default: none.
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// With --masquerade: the node's addresses masqueraded flows leave with (the node file's
    /// `nodeIP` and `nodeIPv6`), at most one per family, comma-separated as --pod-cidr. Default:
    /// for each family of the pod CIDRs, the uplink's address of that family, read now (the
    /// primary global IPv4 address; the first usable global IPv6 one).
    #[arg(long, value_delimiter = ',')]
    node_ip: Vec<IpAddr>,
    /// Have the agent serve the cluster's Services in place of kube-proxy (the node file's
    /// `kubeProxyReplacement`).
    #[arg(long)]
    kube_proxy_replacement: bool,
    /// The binary to install. Default: the running one.
    #[arg(long)]
    binary: Option<PathBuf>,
}

pub fn run(args: Install) -> Result<()> {
    let pod_cidrs = match (args.pod_cidr.is_empty(), &args.node) {
        (false, _) => Cidrs::of("--pod-cidr", &args.pod_cidr)?,
        (true, Some(node)) => node_pod_cidrs(&args.source.node(node)?)?,
        (true, None) => bail!("give --pod-cidr, or --node to read it from the API server"),
    };
    let cluster_cidrs = Cidrs::of("--cluster-cidr", &args.cluster_cidr)?;
    if pod_cidrs.v6.is_some() && cluster_cidrs.v4.is_some() && cluster_cidrs.v6.is_none() {
        // Allowed (the datapath then takes the node's own IPv6 pod CIDR for the cluster's),
        // but most likely a DaemonSet not yet told that the cluster became dual-stack.
        eprintln!(
            "note: --cluster-cidr has no IPv6 CIDR: the plugin takes this node's IPv6 pod CIDR for the cluster's"
        );
    }
    let node_ips = if args.masquerade { node_ips(&args, &pod_cidrs)? } else { NodeIps::default() };
    let node_file = node_file(&args, &pod_cidrs, &cluster_cidrs, &node_ips)?;
    let conflist = conflist(&args, &pod_cidrs, &cluster_cidrs)?;
    let source = match &args.binary {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("finding the running binary")?,
    };
    let bin = args.root.join("opt/cni/bin/ebpf-cni");
    let bytes = fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    replace(&bin, &bytes, 0o755)?;
    println!("installed {}", bin.display());
    // The node file before the conflist: no runtime sees this network unconfined.
    let node_path = args.root.join(node_conf::DEFAULT_PATH.trim_start_matches('/'));
    write_if_changed(&node_path, &node_file, "the node-level settings every network is held to")?;
    let conf = args.root.join("etc/cni/net.d").join(CONFLIST);
    write_if_changed(&conf, &conflist, &format!("pods get addresses from {}", pod_cidrs.joined()))?;
    Ok(())
}

/// Writes `value` as pretty JSON unless the file holds exactly that already, owned by this
/// user (root) with mode 0644 (the plugin refuses a node file that others may write).
fn write_if_changed(path: &Path, value: &impl serde::Serialize, what: &str) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    let as_written = fs::symlink_metadata(path).is_ok_and(|m| {
        m.is_file() && m.uid() == nix::unistd::geteuid().as_raw() && m.permissions().mode() & 0o7777 == 0o644
    });
    if as_written && fs::read_to_string(path).is_ok_and(|old| old == text) {
        println!("{} is up to date", path.display());
    } else {
        replace(path, text.as_bytes(), 0o644)?;
        println!("wrote {} ({what})", path.display());
    }
    Ok(())
}

/// The node file: this network is the primary one (the only one that may masquerade) with the
/// conflist's `ipMasq` and `clusterCIDR` (the pod CIDRs when none is given), pods take addresses from this node's pod CIDRs only,
/// and the node-level settings the flags give; the rest the plugin finds on the node.
fn node_file(args: &Install, pod_cidrs: &Cidrs, cluster_cidrs: &Cidrs, node_ips: &NodeIps) -> Result<NodeConf> {
    if let Some(uplink) = args.uplink.as_deref().filter(|u| u.is_empty() || u.len() > 15 || u.contains('/')) {
        bail!("--uplink {uplink:?} is not an interface name");
    }
    if args.log_file.as_ref().is_some_and(|f| !f.is_absolute()) {
        bail!("--log-file must be an absolute path");
    }
    Ok(NodeConf {
        primary_network: Some(args.network.clone()),
        ip_masq: Some(args.masquerade),
        // What the network's first ADD takes when the conflist has none, the pod CIDRs, written
        // out: a configuration taking the network's name cannot load it with a narrower one.
        cluster_cidr: Some(if cluster_cidrs.iter().next().is_some() { cluster_cidrs } else { pod_cidrs }.joined()),
        pod_cidrs: Some(pod_cidrs.iter().collect()),
        uplink: args.uplink.clone(),
        // Read once here rather than from the uplink by every ADD: an address the uplink gained
        // or lost later (renumbering) would otherwise make ADD's settings differ from the loaded
        // ones, and every ADD be refused until the network's last pod is gone.
        node_ip: node_ips.v4,
        node_ipv6: node_ips.v6,
        log_file: args.log_file.clone(),
        // Unset rather than false when off: node files written before the switch stay the same.
        kube_proxy_replacement: args.kube_proxy_replacement.then_some(true),
        ..NodeConf::default()
    })
}

/// The node file's `nodeIP` and `nodeIPv6`.
#[derive(Debug, Default)]
struct NodeIps {
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
}

/// `--node-ip`, or for each family of the pod CIDRs it leaves out, the uplink's address of that
/// family (`--uplink`, else the default route's interface), as an ADD would find it. One the
/// uplink does not have yet is left out of the node file, with a note: ADD then reads it.
fn node_ips(args: &Install, pod_cidrs: &Cidrs) -> Result<NodeIps> {
    let mut ips = NodeIps::default();
    for ip in &args.node_ip {
        let twice = match *ip {
            IpAddr::V4(v4) => ips.v4.replace(v4).is_some(),
            IpAddr::V6(v6) => ips.v6.replace(v6).is_some(),
        };
        if twice {
            bail!("--node-ip: at most one address per family (got {:?})", args.node_ip);
        }
    }
    let want_v4 = pod_cidrs.v4.is_some() && ips.v4.is_none();
    let want_v6 = pod_cidrs.v6.is_some() && ips.v6.is_none();
    if !want_v4 && !want_v6 {
        return Ok(ips);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let read = runtime.block_on(async {
        let node = Netlink::connect().context("opening netlink")?;
        let index = match &args.uplink {
            Some(name) => node.link(name).await?.with_context(|| format!("uplink {name} does not exist"))?.index,
            None => {
                node.default_route_ifindex().await?.context("the node has no IPv4 default route (give --uplink)")?
            }
        };
        let v4 = if want_v4 { node.primary_ipv4(index).await? } else { None };
        let v6 = if want_v6 { node.primary_ipv6(index).await? } else { None };
        anyhow::Ok((v4, v6))
    });
    match read {
        Ok((v4, v6)) => {
            ips.v4 = ips.v4.or(v4);
            ips.v6 = ips.v6.or(v6);
        }
        Err(e) => eprintln!("note: cannot read the uplink's addresses ({e:#})"),
    }
    for (wanted, found, key) in [(want_v4, ips.v4.is_some(), "nodeIP"), (want_v6, ips.v6.is_some(), "nodeIPv6")] {
        if wanted && !found {
            eprintln!("note: the node file has no {key}: each ADD reads it from the uplink (give --node-ip)");
        }
    }
    Ok(ips)
}

/// At most one CIDR per address family, each normalised to its network address.
#[derive(Debug, Default, PartialEq, Eq)]
struct Cidrs {
    v4: Option<Ipv4Network>,
    v6: Option<Ipv6Network>,
}

impl Cidrs {
    fn of(what: &str, cidrs: &[IpNetwork]) -> Result<Self> {
        let mut sorted = Self::default();
        for cidr in cidrs {
            let twice = match *cidr {
                IpNetwork::V4(n) => sorted.v4.replace(Ipv4Network::new(n.network(), n.prefix())?).is_some(),
                IpNetwork::V6(n) => sorted.v6.replace(Ipv6Network::new(n.network(), n.prefix())?).is_some(),
            };
            if twice {
                bail!("{what}: at most one CIDR per address family (got {cidrs:?})");
            }
        }
        Ok(sorted)
    }

    /// IPv4 first, as Kubernetes' dual-stack flags and the plugin's `clusterCIDR` write them.
    fn iter(&self) -> impl Iterator<Item = IpNetwork> {
        self.v4.map(IpNetwork::V4).into_iter().chain(self.v6.map(IpNetwork::V6))
    }

    fn joined(&self) -> String {
        self.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
    }
}

/// Every CIDR of the node's `spec.podCIDRs` (else `spec.podCIDR`).
fn node_pod_cidrs(node: &kube::Node) -> Result<Cidrs> {
    use kube::NodeExt as _;
    let cidrs = Cidrs { v4: node.pod_cidr_v4(), v6: node.pod_cidr_v6() };
    if cidrs == Cidrs::default() {
        bail!("node {} has no spec.podCIDR yet (is --allocate-node-cidrs on?)", node.node_name());
    }
    Ok(cidrs)
}

/// The node's conflist, checked with the plugin's own parsers (configuration and IPAM) before
/// anything is written.
fn conflist(args: &Install, pod_cidrs: &Cidrs, cluster_cidrs: &Cidrs) -> Result<Value> {
    // One range set per family: host-local's dual-stack form, one address of each per pod.
    let ranges: Vec<Value> = pod_cidrs.iter().map(|subnet| json!([{ "subnet": subnet.to_string() }])).collect();
    let defaults = [pod_cidrs.v4.map(|_| "0.0.0.0/0"), pod_cidrs.v6.map(|_| "::/0")];
    let routes: Vec<Value> = defaults.into_iter().flatten().map(|dst| json!({ "dst": dst })).collect();
    // `bandwidth`: kubelet hands a pod's bandwidth annotations only to plugins that declare it.
    let mut plugin = json!({
        "type": "ebpf-cni",
        "capabilities": { "bandwidth": true },
        "ipMasq": args.masquerade,
        "ipam": { "type": "host-local", "ranges": ranges, "routes": routes },
    });
    if cluster_cidrs.iter().next().is_some() {
        plugin["clusterCIDR"] = json!(cluster_cidrs.joined());
    }
    // Runtimes of today speak 1.0.0 at most and want the answer in the version they asked for.
    let list = json!({ "cniVersion": "1.0.0", "name": args.network, "plugins": [plugin] });
    let mut check = list["plugins"][0].clone();
    check["cniVersion"] = list["cniVersion"].clone();
    check["name"] = list["name"].clone();
    let raw = check.to_string();
    let refused = |e: crate::cni::CniError| anyhow::anyhow!("the conflist would be refused: {e}");
    let conf = NetConf::parse(raw.as_bytes()).map_err(refused)?;
    Ipam::from_conf(&conf, raw.as_bytes()).map_err(refused)?;
    Ok(list)
}

/// Writes `bytes` beside `path`, flushes them to disk, then renames over `path`.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().context("no parent directory")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let aside = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> Result<()> {
        let mut file = File::create(&aside)?;
        file.write_all(bytes)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&aside, path)?;
        File::open(dir)?.sync_all()?;
        Ok(())
    };
    write().inspect_err(|_| drop(fs::remove_file(&aside))).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        install: Install,
    }

    fn parse(args: &[&str]) -> Install {
        Cli::try_parse_from(["install", "--root", "/nowhere"].iter().chain(args)).unwrap().install
    }

    #[test]
    fn dual_stack_conflist_has_one_range_set_per_family_ipv4_first() {
        for pod_cidr in [
            &["--pod-cidr", "fd00:10:244:1::/64,10.244.1.0/24"][..],
            &["--pod-cidr", "10.244.1.0/24", "--pod-cidr", "fd00:10:244:1::/64"],
        ] {
            let mut args = vec!["--cluster-cidr", "fd00:10:244::/56,10.244.0.0/16"];
            args.extend(pod_cidr);
            let args = parse(&args);
            let pods = Cidrs::of("--pod-cidr", &args.pod_cidr).unwrap();
            let cluster = Cidrs::of("--cluster-cidr", &args.cluster_cidr).unwrap();
            let plugin = &conflist(&args, &pods, &cluster).unwrap()["plugins"][0];
            assert_eq!(
                plugin["ipam"]["ranges"],
                json!([[{ "subnet": "10.244.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]])
            );
            assert_eq!(plugin["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]));
            assert_eq!(plugin["clusterCIDR"], "10.244.0.0/16,fd00:10:244::/56");
        }
    }

    #[test]
    fn single_stack_ipv4_conflist_is_as_before() {
        let args = parse(&["--pod-cidr", "10.244.1.7/24"]);
        let pods = Cidrs::of("--pod-cidr", &args.pod_cidr).unwrap();
        let list = conflist(&args, &pods, &Cidrs::default()).unwrap();
        let plugin = &list["plugins"][0];
        assert_eq!(plugin["ipam"]["ranges"], json!([[{ "subnet": "10.244.1.0/24" }]]), "the network address");
        assert_eq!(plugin["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }]));
        assert!(plugin.get("clusterCIDR").is_none());
    }

    #[test]
    fn refuses_two_cidrs_of_one_family_and_what_the_plugin_would_refuse() {
        let args = parse(&["--pod-cidr", "10.244.1.0/24,10.244.2.0/24"]);
        let err = Cidrs::of("--pod-cidr", &args.pod_cidr).unwrap_err().to_string();
        assert!(err.contains("at most one CIDR per address family"), "{err}");
        // host-local refuses an IPv6 subnet narrower than /126: caught before anything is written.
        let args = parse(&["--pod-cidr", "10.244.1.0/24,fd00::/127"]);
        let pods = Cidrs::of("--pod-cidr", &args.pod_cidr).unwrap();
        let err = conflist(&args, &pods, &Cidrs::default()).unwrap_err().to_string();
        assert!(err.contains("would be refused"), "{err}");
    }

    #[test]
    fn replace_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("ecni-install-unit-{}", std::process::id()));
        let target = dir.join("a/b/file");
        replace(&target, b"one", 0o644).unwrap();
        replace(&target, b"two", 0o755).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"two");
        assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read_dir(target.parent().unwrap()).unwrap().count(), 1);
        fs::remove_dir_all(dir).unwrap();
    }
}
