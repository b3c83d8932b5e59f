//! The node's own settings file, `/etc/ebpf-cni/node.json`: the trust boundary between the node
//! and whoever may write a network configuration (with Multus, any namespace admin through a
//! NetworkAttachmentDefinition; the network's name is theirs to choose, so it proves nothing).
//! When the file exists, the settings that reach past a network's own pods come from it: a
//! configuration may leave them out or repeat them, never change them; only the node's primary
//! network may masquerade (attach programs to the uplink), with the datapath settings the node
//! file gives it (so that whoever loads it first, the agent ahead of the first pod or any
//! configuration of that name, loads the same); and pod addresses stay inside the node file's `podCIDRs`.
//! The primary network's datapath takes every node-level setting from the node file alone (its
//! pod subnets are the first `podCIDRs` entry of each family), and a configuration of that name
//! whose IPAM ranges are other subnets is refused before anything is touched ([`NodeSubnets`]).
//! Without the file every configuration is trusted as the node's own, as before the file existed.
use std::{
    fs::File,
    io::Read as _,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

use super::{
    CniError, CniResult, ErrorCode,
    config::{self, NetConf},
};

/// Written by `ebpf-cni install`. Not in `/etc/cni/net.d`: runtimes load every file there.
pub const DEFAULT_PATH: &str = "/etc/ebpf-cni/node.json";

/// Another path for the node file (tests, a node with its own layout). Set by the runtime,
/// which is trusted; a network configuration cannot set it.
pub const PATH_ENV: &str = "EBPF_CNI_NODE_CONF";

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConf {
    /// The one network that may set `ipMasq`. Its `ipMasq` and `clusterCIDR` are node-level
    /// too: whichever configuration of that name loads its datapath first (a
    /// NetworkAttachmentDefinition may take the name) loads it with the node's settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary_network: Option<String>,
    /// The primary network's `ipMasq`.
    #[serde(rename = "ipMasq", skip_serializing_if = "Option::is_none")]
    pub ip_masq: Option<bool>,
    /// The primary network's `clusterCIDR`.
    #[serde(rename = "clusterCIDR", skip_serializing_if = "Option::is_none")]
    pub cluster_cidr: Option<String>,
    /// The primary network's `masqPodFlowsPerMinute`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masq_pod_flows_per_minute: Option<u32>,
    /// The primary network's `ebpfLogLevel` (the agent loads its datapath with it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ebpf_log_level: Option<String>,
    /// Every network's `masqPortRange`: the ports of the node's own address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masq_port_range: Option<String>,
    /// Where pod addresses may come from, whatever the network: a pod's address gets a host
    /// route through its veth, which would take that address's traffic from the node (another
    /// node's pods, the API server, a LAN host). Unset: anywhere but the node's own addresses.
    /// The first of each family is the primary network's pod subnet (the installer writes
    /// only those; a secondary network's ranges go after them).
    #[serde(rename = "podCIDRs", skip_serializing_if = "Option::is_none")]
    pub pod_cidrs: Option<Vec<IpNetwork>>,
    /// Unset: the default route's interface, and configurations may not name one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uplink: Option<String>,
    #[serde(rename = "nodeIP", skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<Ipv4Addr>,
    #[serde(rename = "nodeIPv6", skip_serializing_if = "Option::is_none")]
    pub node_ipv6: Option<Ipv6Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpffs_root: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_file: Option<PathBuf>,
    /// The built-in host-local IPAM's `dataDir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipam_data_dir: Option<PathBuf>,
    /// The primary network serves the cluster's Services itself, in place of kube-proxy: the
    /// agent watches Services and EndpointSlices and writes them into the socket LB's maps, whose
    /// cgroup programs translate connections. Off when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_proxy_replacement: Option<bool>,
    /// The agent enforces the cluster's NetworkPolicies on the primary network (it watches
    /// NetworkPolicies, Pods and Namespaces). On when unset; `false` turns it off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<bool>,
    /// Where the socket LB's programs attach: every process in this cgroup or below has its
    /// Service connections translated. Unset: the node's cgroup2 mount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_root: Option<PathBuf>,
    /// The Service maps' sizes, for nodes of more Services than the defaults hold (each
    /// documented in ebpf-common's `service.rs` and `service_ct.rs`); the primary network's,
    /// taken at its next load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_map_entries: Option<ServiceMapEntries>,
}

/// Sizes of the Service maps; each unset one keeps its default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMapEntries {
    /// `SVC_FRONTENDS`: Service frontends (one per Service port, address and protocol).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontends: Option<u32>,
    /// `SVC_BACKENDS`: backend slots (two per backend of each frontend: the two banks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backends: Option<u32>,
    /// `SVC_CT`: per-packet translated flows, both ways (NodePorts and external IPs from the LAN).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u32>,
}

impl ServiceMapEntries {
    /// Smallest and largest size accepted: a map of fewer entries would refuse a small
    /// cluster's Services, one of more costs gigabytes of kernel memory.
    pub const RANGE: std::ops::RangeInclusive<u32> = 1_024..=16_777_216;

    /// The maps to size, by name.
    pub fn sizes(&self) -> Vec<(&'static str, u32)> {
        let named = [
            (ebpf_common::names::SVC_FRONTENDS, self.frontends),
            (ebpf_common::names::SVC_BACKENDS, self.backends),
            (ebpf_common::names::SVC_CT, self.connections),
        ];
        named.into_iter().filter_map(|(name, size)| Some((name, size?))).collect()
    }
}

/// What a verb does with a configuration that changes a node-level setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// ADD, CHECK, GC, STATUS: code 7, naming the setting and the node file.
    Refuse,
    /// DEL must be able to finish: the node's values replace the configuration's (so it acts
    /// exactly as a well-behaved configuration would) and a warning is logged.
    Override,
}

impl NodeConf {
    /// The node file at `path`, or None when there is none. It must be a regular file owned by
    /// root (or the plugin's user) that nobody else may write: otherwise it is no boundary.
    pub fn load(path: &Path) -> CniResult<Option<Self>> {
        let unusable =
            |why: String| CniError::new(ErrorCode::INVALID_CONFIG, format!("node file {}: {why}", path.display()));
        let mut file = match File::options().read(true).custom_flags(libc::O_NOFOLLOW).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unusable(format!("cannot open it ({e})"))),
        };
        let meta = file.metadata().map_err(|e| unusable(e.to_string()))?;
        let owners = [0, nix::unistd::geteuid().as_raw()];
        if !meta.is_file() || !owners.contains(&meta.uid()) || meta.mode() & 0o022 != 0 {
            return Err(unusable(format!(
                "must be a regular file owned by root and writable by nobody else (uid {}, mode {:o})",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| unusable(e.to_string()))?;
        let node: Self = serde_json::from_str(&text).map_err(|e| unusable(format!("invalid: {e}")))?;
        node.validate().map_err(|e| unusable(e.msg))?;
        Ok(Some(node))
    }

    fn validate(&self) -> CniResult<()> {
        let invalid = |msg: &str| Err(CniError::new(ErrorCode::INVALID_CONFIG, msg));
        let primary_only = [
            self.ip_masq.is_some(),
            self.cluster_cidr.is_some(),
            self.masq_pod_flows_per_minute.is_some(),
            self.ebpf_log_level.is_some(),
            self.kube_proxy_replacement.is_some(),
            self.cgroup_root.is_some(),
        ];
        if self.primary_network.is_none() && primary_only.contains(&true) {
            return invalid(
                "ipMasq, clusterCIDR, masqPodFlowsPerMinute, ebpfLogLevel, kubeProxyReplacement and \
                 cgroupRoot are the primary network's: name it in primaryNetwork",
            );
        }
        if let Some(level) = &self.ebpf_log_level {
            config::parse_ebpf_log_level(level)?;
        }
        if self.log_file.as_ref().is_some_and(|f| !f.is_absolute()) {
            return invalid("logFile must be an absolute path");
        }
        if self.cgroup_root.as_ref().is_some_and(|f| !f.is_absolute()) {
            return invalid("cgroupRoot must be an absolute path");
        }
        let sizes = self.service_map_entries.map(|e| e.sizes()).unwrap_or_default();
        if let Some((map, size)) = sizes.iter().find(|(_, n)| !ServiceMapEntries::RANGE.contains(n)) {
            let (min, max) = (ServiceMapEntries::RANGE.start(), ServiceMapEntries::RANGE.end());
            return invalid(&format!("serviceMapEntries: {size} entries for {map} is out of {min}..={max}"));
        }
        canonical_cluster_cidr(&self.cluster_cidr)?;
        canonical_ports(&self.masq_port_range)?;
        Ok(())
    }

    /// [`Self::load`] from `EBPF_CNI_NODE_CONF`, else [`DEFAULT_PATH`].
    pub fn load_default() -> CniResult<Option<(PathBuf, Self)>> {
        let path = std::env::var_os(PATH_ENV).map_or_else(|| PathBuf::from(DEFAULT_PATH), PathBuf::from);
        Ok(Self::load(&path)?.map(|node| (path, node)))
    }

    /// Fills the node-level settings `conf` leaves out from the node file, and refuses (or, for
    /// DEL, overrides) those it sets to anything else. Returns what was overridden, for the log
    /// (which itself is configured from the confined settings).
    pub fn confine(&self, path: &Path, conf: &mut NetConf, mismatch: Mismatch) -> CniResult<Vec<String>> {
        let overridden = std::cell::RefCell::new(Vec::new());
        let network = conf.name.clone();
        let refuse = |key: &str, wanted: String, node: Option<String>| -> CniResult<()> {
            let node = node.map_or_else(|| "leaves it to the node".into(), |v| format!("sets it to {v}"));
            let msg = format!("{key} {wanted} is a node-level setting: the node file {} {node}", path.display());
            match mismatch {
                Mismatch::Refuse => Err(CniError::new(ErrorCode::INVALID_CONFIG, msg)
                    .with_details(format!("leave {key} out of network {network:?}'s configuration"))),
                Mismatch::Override => {
                    overridden.borrow_mut().push(format!("{msg}; DEL uses the node's value"));
                    Ok(())
                }
            }
        };
        confine_field(&mut conf.uplink, &self.uplink, |w, n| refuse("uplink", quoted(w), n.map(quoted)))?;
        confine_field(&mut conf.node_ip, &self.node_ip, |w, n| {
            refuse("nodeIP", w.to_string(), n.map(|n| n.to_string()))
        })?;
        confine_field(&mut conf.node_ipv6, &self.node_ipv6, |w, n| {
            refuse("nodeIPv6", w.to_string(), n.map(|n| n.to_string()))
        })?;
        confine_field(&mut conf.bpffs_root, &self.bpffs_root, |w, n| {
            refuse("bpffsRoot", shown(w), n.map(|n| shown(n)))
        })?;
        confine_field(&mut conf.log_file, &self.log_file, |w, n| refuse("logFile", shown(w), n.map(|n| shown(n))))?;
        self.confine_data_dir(conf, &refuse)?;
        conf.masq_port_range = canonical_ports(&conf.masq_port_range)?;
        confine_field(&mut conf.masq_port_range, &canonical_ports(&self.masq_port_range)?, |w, n| {
            refuse("masqPortRange", quoted(w), n.map(quoted))
        })?;
        conf.allowed_pod_cidrs.clone_from(&self.pod_cidrs);
        if self.primary_network.as_deref() == Some(conf.name.as_str()) {
            conf.node_subnets = Some(self.primary_subnets(path));
            confine_field(&mut conf.ip_masq, &self.ip_masq, |w, n| {
                refuse("ipMasq", w.to_string(), n.map(|n| n.to_string()))
            })?;
            conf.cluster_cidr = canonical_cluster_cidr(&conf.cluster_cidr)?;
            confine_field(&mut conf.cluster_cidr, &canonical_cluster_cidr(&self.cluster_cidr)?, |w, n| {
                refuse("clusterCIDR", quoted(w), n.map(quoted))
            })?;
            confine_field(&mut conf.masq_pod_flows_per_minute, &self.masq_pod_flows_per_minute, |w, n| {
                refuse("masqPodFlowsPerMinute", w.to_string(), n.map(|n| n.to_string()))
            })?;
            confine_field(&mut conf.ebpf_log_level, &self.ebpf_log_level, |w, n| {
                refuse("ebpfLogLevel", quoted(w), n.map(quoted))
            })?;
            conf.socket_lb_cgroup = self.socket_lb_cgroup();
            conf.service_map_entries = self.service_map_entries.map(|e| e.sizes()).unwrap_or_default();
        } else if conf.masquerades() {
            let primary = self.primary_network.as_ref().map_or_else(|| "none".into(), |p| format!("{p:?}"));
            let msg = format!(
                "ipMasq: only the node's primary network may masquerade (the node file {} names {primary}, not {:?})",
                path.display(),
                conf.name
            );
            match mismatch {
                Mismatch::Refuse => {
                    return Err(CniError::new(ErrorCode::INVALID_CONFIG, msg)
                        .with_details("masquerade attaches programs to the node's uplink"));
                }
                Mismatch::Override => {
                    overridden.borrow_mut().push(format!("{msg}; DEL goes on without it"));
                    conf.ip_masq = None;
                }
            }
        }
        Ok(overridden.into_inner())
    }

    /// With `kubeProxyReplacement`, the cgroup the socket LB attaches to: `cgroupRoot`, else the
    /// node's cgroup2 mount (`/sys/fs/cgroup` where it is missing from the mount table: the
    /// load then says it cannot open it).
    pub fn socket_lb_cgroup(&self) -> Option<PathBuf> {
        if self.kube_proxy_replacement != Some(true) {
            return None;
        }
        Some(self.cgroup_root.clone().unwrap_or_else(|| cgroup2_mount().unwrap_or_else(|| "/sys/fs/cgroup".into())))
    }

    /// The primary network's pod subnets: the first of each family in `podCIDRs`.
    pub fn primary_subnets(&self, path: &Path) -> NodeSubnets {
        let cidrs = self.pod_cidrs.iter().flatten();
        let v4 = cidrs.clone().find_map(|c| match c {
            IpNetwork::V4(n) => Ipv4Network::new(n.network(), n.prefix()).ok(),
            IpNetwork::V6(_) => None,
        });
        let v6 = cidrs.clone().find_map(|c| match c {
            IpNetwork::V6(n) => Ipv6Network::new(n.network(), n.prefix()).ok(),
            IpNetwork::V4(_) => None,
        });
        NodeSubnets { node_file: path.to_path_buf(), v4, v6 }
    }

    /// host-local's `dataDir` (only the built-in one's: a delegated plugin's configuration is
    /// that plugin's business).
    fn confine_data_dir(&self, conf: &mut NetConf, refuse: &Refuse<'_>) -> CniResult<()> {
        let Some(ipam) = conf.ipam.as_mut().and_then(Value::as_object_mut) else { return Ok(()) };
        if !crate::ipam::is_built_in(ipam.get("type").and_then(Value::as_str).unwrap_or_default()) {
            return Ok(());
        }
        let mut wanted = match ipam.get("dataDir") {
            None => None,
            Some(Value::String(dir)) => Some(PathBuf::from(dir)),
            Some(other) => Some(PathBuf::from(other.to_string())),
        };
        confine_field(&mut wanted, &self.ipam_data_dir, |w, n| refuse("ipam.dataDir", shown(w), n.map(|n| shown(n))))?;
        match wanted {
            Some(dir) => ipam.insert("dataDir".into(), Value::String(dir.display().to_string())),
            None => ipam.remove("dataDir"),
        };
        Ok(())
    }
}

/// The node file's pod subnets of its primary network (the first `podCIDRs` entry of each
/// family): with them, not with what the configuration's IPAM hands out, that network's
/// datapath is loaded (this node's pod subnet, the cluster range a `clusterCIDR` left out
/// defaults to, which node addresses are set). A configuration that takes the primary's name is
/// canonical only when its IPAM draws from exactly these subnets, one range set per family;
/// anything else is refused with code 7 before anything is touched, so it can neither load nor
/// replace the datapath nor lock the real configuration out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSubnets {
    pub node_file: PathBuf,
    pub v4: Option<Ipv4Network>,
    pub v6: Option<Ipv6Network>,
}

impl NodeSubnets {
    fn refuse(&self, msg: String) -> CniError {
        CniError::new(ErrorCode::INVALID_CONFIG, msg).with_details(format!(
            "the node file {} names this network its primary one: its IPAM ranges are the node file's \
             podCIDRs ({}), one range set per family",
            self.node_file.display(),
            self.describe()
        ))
    }

    fn describe(&self) -> String {
        let list: Vec<String> = self.iter().map(|n| n.to_string()).collect();
        if list.is_empty() { "none".into() } else { list.join(", ") }
    }

    fn iter(&self) -> impl Iterator<Item = IpNetwork> + Clone {
        self.v4.map(IpNetwork::V4).into_iter().chain(self.v6.map(IpNetwork::V6))
    }

    /// The node file's subnet of `net`'s family.
    fn of_family(&self, net: &IpNetwork) -> Option<IpNetwork> {
        match net {
            IpNetwork::V4(_) => self.v4.map(IpNetwork::V4),
            IpNetwork::V6(_) => self.v6.map(IpNetwork::V6),
        }
    }

    /// Before anything is touched: the node file gives the primary network a pod subnet, and
    /// the built-in IPAM's range sets (each range's subnet, by set) are those subnets.
    pub fn check_ranges(&self, sets: Option<&[Vec<IpNetwork>]>) -> CniResult<()> {
        if self.v4.is_none() && self.v6.is_none() {
            return Err(CniError::new(
                ErrorCode::INVALID_CONFIG,
                format!(
                    "the node file {} names this network its primary one but gives no podCIDRs",
                    self.node_file.display()
                ),
            )
            .with_details("the primary network's datapath is loaded from the node file's podCIDRs: add them"));
        }
        let Some(sets) = sets else { return Ok(()) };
        for subnet in sets.iter().flatten() {
            if self.of_family(subnet) != Some(*subnet) {
                return Err(self.refuse(format!(
                    "ipam subnet {subnet} is not the primary network's pod subnet of the node file {}",
                    self.node_file.display()
                )));
            }
        }
        self.check_families(sets.iter().filter_map(|set| set.first()), "ipam range sets")
    }

    /// After IPAM (a delegated plugin's ranges are its own): each address is in the node file's
    /// subnet of its family, with that subnet's prefix.
    pub fn check_allocation(&self, ips: &[IpNetwork]) -> CniResult<()> {
        for ip in ips {
            let subnet = IpNetwork::new(ip.network(), ip.prefix()).expect("same prefix");
            if self.of_family(ip) != Some(subnet) {
                return Err(self.refuse(format!(
                    "ipam gave {ip}, not an address of the primary network's pod subnet of the node file {}",
                    self.node_file.display()
                )));
            }
        }
        self.check_families(ips.iter(), "ipam addresses")
    }

    /// One of each family the node file gives, no more.
    fn check_families<'a>(&self, nets: impl Iterator<Item = &'a IpNetwork>, what: &str) -> CniResult<()> {
        let (mut v4, mut v6) = (0, 0);
        for net in nets {
            *if net.is_ipv4() { &mut v4 } else { &mut v6 } += 1;
        }
        if (v4, v6) != (usize::from(self.v4.is_some()), usize::from(self.v6.is_some())) {
            return Err(self.refuse(format!(
                "{what}: {v4} IPv4 and {v6} IPv6, where the node file {} gives the primary network {}",
                self.node_file.display(),
                self.describe()
            )));
        }
        Ok(())
    }
}

/// Told a key, the configuration's value and the node's: refuses, or notes the override.
type Refuse<'a> = dyn Fn(&str, String, Option<String>) -> CniResult<()> + 'a;

/// The node's value wins: it fills a gap, and replaces a different value after `differs` (which
/// refuses, or lets the override happen) has been told.
fn confine_field<T: Clone + PartialEq>(
    field: &mut Option<T>,
    node: &Option<T>,
    differs: impl FnOnce(&T, Option<&T>) -> CniResult<()>,
) -> CniResult<()> {
    if let Some(wanted) = field.as_ref()
        && node.as_ref() != Some(wanted)
    {
        differs(wanted, node.as_ref())?;
    }
    field.clone_from(node);
    Ok(())
}

/// `masqPortRange` as `min-max`, so that `"1024 - 29999"` repeats `"1024-29999"`.
fn canonical_ports(text: &Option<String>) -> CniResult<Option<String>> {
    let Some(text) = text else { return Ok(None) };
    let ports = config::parse_masq_ports(text)?;
    Ok(Some(format!("{}-{}", ports.start(), ports.end())))
}

/// `clusterCIDR` as network addresses, IPv4 first.
fn canonical_cluster_cidr(text: &Option<String>) -> CniResult<Option<String>> {
    let Some(text) = text else { return Ok(None) };
    let (v4, v6) = config::parse_cluster_cidr(text)?;
    let parts: Vec<String> = v4.map(|n| n.to_string()).into_iter().chain(v6.map(|n| n.to_string())).collect();
    Ok(Some(parts.join(",")))
}

/// The first cgroup2 mount in this process's mount table (`/proc/self/mountinfo`: field 5 is
/// the mount point, the filesystem type follows the ` - ` separator).
fn cgroup2_mount() -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (mount, rest) = line.split_once(" - ")?;
        if rest.split(' ').next() == Some("cgroup2") { mount.split(' ').nth(4).map(PathBuf::from) } else { None }
    })
}

fn quoted(s: &String) -> String {
    format!("{s:?}")
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        let raw = format!(
            r#"{{"cniVersion":"1.0.0","name":"nad","type":"ebpf-cni","ipam":{{"type":"host-local","subnet":"10.1.0.0/24"}}{extra}}}"#
        );
        NetConf::parse(raw.as_bytes()).unwrap()
    }

    fn node() -> NodeConf {
        NodeConf {
            primary_network: Some("ebpf-cni".into()),
            ip_masq: Some(true),
            cluster_cidr: Some("10.244.0.0/16".into()),
            masq_pod_flows_per_minute: Some(100),
            ebpf_log_level: Some("debug".into()),
            masq_port_range: Some("1024-29999".into()),
            pod_cidrs: Some(vec!["10.1.0.0/24".parse().unwrap()]),
            uplink: Some("eth0".into()),
            bpffs_root: Some("/sys/fs/bpf/ebpf-cni".into()),
            ipam_data_dir: Some("/var/lib/cni/networks".into()),
            ..NodeConf::default()
        }
    }

    const PATH: &str = "/etc/ebpf-cni/node.json";

    #[test]
    fn omitted_settings_come_from_the_node_file() {
        let mut c = conf("");
        node().confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        assert_eq!(c.uplink.as_deref(), Some("eth0"));
        assert_eq!(c.bpffs_root(), PathBuf::from("/sys/fs/bpf/ebpf-cni"));
        assert_eq!(c.ipam.unwrap()["dataDir"], "/var/lib/cni/networks");
        assert_eq!(c.log_file, None);
    }

    #[test]
    fn repeating_the_node_value_is_fine() {
        let mut c = conf(r#","uplink":"eth0","bpffsRoot":"/sys/fs/bpf/ebpf-cni""#);
        node().confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
    }

    #[test]
    fn a_different_value_is_refused_with_code_7_naming_key_and_file() {
        for (extra, key) in [
            (r#","uplink":"eth1""#, "uplink \"eth1\""),
            (r#","nodeIP":"192.0.2.9""#, "nodeIP 192.0.2.9"),
            (r#","nodeIPv6":"2001:db8::9""#, "nodeIPv6 2001:db8::9"),
            (r#","bpffsRoot":"/sys/fs/bpf/elsewhere""#, "bpffsRoot /sys/fs/bpf/elsewhere"),
            (r#","logFile":"/etc/shadow""#, "logFile /etc/shadow"),
            (r#","ipam":{"type":"host-local","subnet":"10.1.0.0/24","dataDir":"/etc"}"#, "ipam.dataDir /etc"),
        ] {
            let err = node().confine(Path::new(PATH), &mut conf(extra), Mismatch::Refuse).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_CONFIG, "{extra}");
            assert!(err.msg.starts_with(key) && err.msg.contains(PATH), "{extra}: {}", err.msg);
        }
    }

    #[test]
    fn only_the_primary_network_may_masquerade_and_only_as_the_node_file_says() {
        let err = node().confine(Path::new(PATH), &mut conf(r#","ipMasq":true"#), Mismatch::Refuse).unwrap_err();
        assert!(err.msg.contains("only the node's primary network"), "{}", err.msg);
        node().confine(Path::new(PATH), &mut conf(r#","ipMasq":false"#), Mismatch::Refuse).unwrap();
        let primary = |extra: &str| {
            let mut c = conf(extra);
            c.name = "ebpf-cni".into();
            node().confine(Path::new(PATH), &mut c, Mismatch::Refuse).map(|_| c)
        };
        let omitted = primary("").unwrap();
        assert!(omitted.masquerades(), "the node file's ipMasq");
        assert_eq!(omitted.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert_eq!((omitted.masq_pod_flows_per_minute, omitted.ebpf_log_level().unwrap()), (Some(100), 4));
        primary(r#","ipMasq":true,"clusterCIDR":"10.244.9.9/16""#).unwrap();
        for (extra, says) in [
            (r#","ipMasq":false"#, "ipMasq false is a node-level setting"),
            (r#","clusterCIDR":"10.0.0.0/8""#, "clusterCIDR \"10.0.0.0/8\""),
            (r#","masqPodFlowsPerMinute":0"#, "masqPodFlowsPerMinute 0"),
            (r#","ebpfLogLevel":"off""#, "ebpfLogLevel \"off\""),
        ] {
            let err = primary(extra).unwrap_err();
            assert!(err.msg.starts_with(says), "{extra}: {}", err.msg);
        }
    }

    #[test]
    fn the_primary_networks_ipam_must_be_the_node_files_pod_subnets() {
        let net = |s: &str| -> IpNetwork { s.parse().unwrap() };
        let mut node = node();
        // A secondary network's range after the primary's: not the primary's subnet.
        node.pod_cidrs = Some(vec![net("10.1.0.7/24"), net("10.9.0.0/16"), net("fd00:1::/64")]);
        let mut c = conf("");
        node.confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        assert_eq!(c.node_subnets, None, "not the primary network");
        c.name = "ebpf-cni".into();
        node.confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        let subnets = c.node_subnets.unwrap();
        assert_eq!(
            (subnets.v4, subnets.v6),
            (Some("10.1.0.0/24".parse().unwrap()), Some("fd00:1::/64".parse().unwrap()))
        );
        subnets.check_ranges(None).unwrap();
        subnets.check_ranges(Some(&[vec![net("10.1.0.0/24"), net("10.1.0.0/24")], vec![net("fd00:1::/64")]])).unwrap();
        subnets.check_allocation(&[net("10.1.0.5/24"), net("fd00:1::5/64")]).unwrap();
        for sets in [
            vec![vec![net("10.9.0.0/16")], vec![net("fd00:1::/64")]],
            vec![vec![net("10.1.0.0/16")], vec![net("fd00:1::/64")]],
            vec![vec![net("10.1.0.0/24")]],
            vec![vec![net("10.1.0.0/24")], vec![net("fd00:1::/64")], vec![net("10.1.0.0/24")]],
            vec![],
        ] {
            let err = subnets.check_ranges(Some(&sets)).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_CONFIG, "{sets:?}");
            assert!(err.details.contains("10.1.0.0/24, fd00:1::/64"), "{sets:?}: {}", err.details);
        }
        for ips in [
            vec![net("10.1.0.5/16"), net("fd00:1::5/64")],
            vec![net("10.9.0.5/16"), net("fd00:1::5/64")],
            vec![net("10.1.0.5/24")],
            vec![],
        ] {
            assert_eq!(subnets.check_allocation(&ips).unwrap_err().code, ErrorCode::INVALID_CONFIG, "{ips:?}");
        }
        node.pod_cidrs = None;
        let mut c = conf("");
        c.name = "ebpf-cni".into();
        node.confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        let err = c.node_subnets.unwrap().check_ranges(None).unwrap_err();
        assert!(err.msg.contains("gives no podCIDRs"), "{}", err.msg);
    }

    #[test]
    fn masq_port_range_is_the_nodes_and_compared_as_a_range() {
        node().confine(Path::new(PATH), &mut conf(r#","masqPortRange":"1024 - 29999""#), Mismatch::Refuse).unwrap();
        let err = node().confine(Path::new(PATH), &mut conf(r#","masqPortRange":"1-65535""#), Mismatch::Refuse);
        assert!(err.unwrap_err().msg.starts_with("masqPortRange \"1-65535\""));
        let mut c = conf("");
        node().confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        assert_eq!((c.masq_port_range.as_deref(), c.allowed_pod_cidrs.unwrap().len()), (Some("1024-29999"), 1));
    }

    #[test]
    fn a_node_file_is_validated() {
        for text in [
            r#"{"ipMasq":true}"#,
            r#"{"ebpfLogLevel":"debug"}"#,
            r#"{"primaryNetwork":"p","ebpfLogLevel":"loud"}"#,
            r#"{"primaryNetwork":"p","clusterCIDR":"10.0.0.0/33"}"#,
            r#"{"masqPortRange":"9-1"}"#,
            r#"{"logFile":"relative.log"}"#,
            r#"{"podCIDRs":["10.0.0.0/8","banana"]}"#,
        ] {
            let parsed = serde_json::from_str::<NodeConf>(text)
                .map_err(|e| e.to_string())
                .and_then(|n| n.validate().map_err(|e| e.msg));
            assert!(parsed.is_err(), "{text}");
        }
    }

    #[test]
    fn del_overrides_instead_of_refusing() {
        let mut c = conf(r#","uplink":"eth1","bpffsRoot":"/tmp/x","ipMasq":true"#);
        node().confine(Path::new(PATH), &mut c, Mismatch::Override).unwrap();
        assert_eq!(
            (c.uplink.as_deref(), c.bpffs_root(), c.masquerades()),
            (Some("eth0"), "/sys/fs/bpf/ebpf-cni".into(), false)
        );
    }

    #[test]
    fn a_delegated_ipams_data_dir_is_left_alone() {
        let mut c = conf(r#","ipam":{"type":"whereabouts","dataDir":"/x"}"#);
        node().confine(Path::new(PATH), &mut c, Mismatch::Refuse).unwrap();
        assert_eq!(c.ipam.unwrap()["dataDir"], "/x");
    }

    /// The example node file of docs/configuration.md is one.
    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../../docs/configuration.md");
        let section = &doc[doc.find("## Trust model").unwrap()..];
        let block = section.split("```json\n").nth(1).unwrap().split("```").next().unwrap();
        let node: NodeConf = serde_json::from_str(block).unwrap();
        assert_eq!(node.primary_network.as_deref(), Some("ebpf-cni"));
        assert!(node.ipam_data_dir.is_some() && node.log_file.is_some() && node.node_ip.is_some());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(serde_json::from_str::<NodeConf>(r#"{"uplinks":"eth0"}"#).is_err());
    }
}
