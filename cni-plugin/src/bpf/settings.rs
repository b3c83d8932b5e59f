//! A network's datapath settings (`DatapathConfig`), resolved from the configuration and, for
//! what it leaves out, from the node: the uplink is the default route's interface, the node's
//! address is the uplink's primary IPv4 address, the cluster CIDR is the pod's subnet (which is
//! also this node's pod subnet). For the node file's primary network the configuration's
//! node-level fields are the node file's (`node_conf.rs`) and the pod subnets passed here are
//! the node file's too, not IPAM's: every field is what the node file implies.
use std::{
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use ebpf_common::DatapathConfig;
use ipnetwork::{Ipv4Network, Ipv6Network};

use crate::{
    cni::{
        CniError, CniResult, Context, ErrorCode,
        config::{DEFAULT_MASQ_POD_FLOWS_PER_MINUTE, NetConf},
    },
    net::netlink::Netlink,
};

#[derive(Debug, PartialEq, Eq)]
pub struct Settings {
    pub config: DatapathConfig,
    /// Where `to_uplink`/`from_uplink` are attached; only with masquerade.
    pub uplink: Option<String>,
    /// aya-log's `AYA_LOG_LEVEL` for the programs (`ebpfLogLevel`); 0, off, by default.
    pub log_level: u8,
    /// The cgroup the socket LB's programs attach to (node file `kubeProxyReplacement`,
    /// `cgroupRoot`); None: Services are left to kube-proxy.
    pub socket_lb: Option<std::path::PathBuf>,
    /// Maps sized other than the object says (`serviceMapEntries`), by name.
    pub map_entries: Vec<(&'static str, u32)>,
}

impl Settings {
    /// `pod_subnet`, `pod_subnet_v6`: the pod's subnets of each family it has an address of
    /// (the node file's, for its primary network: they decide which node addresses are set).
    pub async fn resolve(
        conf: &NetConf,
        pod_subnet: Option<Ipv4Network>,
        pod_subnet_v6: Option<Ipv6Network>,
        node: &Netlink,
    ) -> CniResult<Self> {
        let mut config = DatapathConfig::default();
        let explicit_cluster = conf.cluster_cidr()?;
        if let Some(cluster) = explicit_cluster.or(pod_subnet) {
            config.cluster_ipv4 = cluster.network().octets();
            config.cluster_prefix = cluster.prefix();
        }
        // The subnet is this node's alone only when it is narrower than the cluster's (per-node
        // subnets, as the agent's routes and kubelet's podCIDR have them). An IPAM subnet as wide
        // as the cluster (ranges cut per node, a cluster-wide IPAM) holds other nodes' pods too.
        if let (Some(cluster), Some(pods)) = (explicit_cluster, pod_subnet)
            && pods.prefix() > cluster.prefix()
            && cluster.contains(pods.network())
        {
            config.node_pods_ipv4 = pods.network().octets();
            config.node_pods_prefix = pods.prefix();
        }
        let explicit_cluster_v6 = conf.cluster_cidr_v6()?;
        if let Some(cluster) = explicit_cluster_v6.or(pod_subnet_v6) {
            config.cluster_ipv6 = cluster.network().octets();
            config.cluster_prefix6 = cluster.prefix();
        }
        if let (Some(cluster), Some(pods)) = (explicit_cluster_v6, pod_subnet_v6)
            && pods.prefix() > cluster.prefix()
            && cluster.contains(pods.network())
        {
            config.node_pods_ipv6 = pods.network().octets();
            config.node_pods_prefix6 = pods.prefix();
        }
        let log_level = conf.ebpf_log_level()?;
        if !conf.masquerades() {
            let map_entries = conf.service_map_entries.clone();
            return Ok(Self { config, uplink: None, log_level, socket_lb: conf.socket_lb_cgroup.clone(), map_entries });
        }
        let (uplink, index) = uplink(conf, node).await?;
        // Each family the pods have needs the node's address of that family.
        if pod_subnet.is_some() {
            let node_ip = match conf.node_ip {
                Some(ip) => ip,
                None => node
                    .primary_ipv4(index)
                    .await
                    .cni(ErrorCode::IO, "cannot list the uplink's addresses")?
                    .ok_or_else(|| {
                        invalid(format!("ipMasq: uplink {uplink} has no global IPv4 address"), "set nodeIP")
                    })?,
            };
            config.node_ipv4 = node_ip.octets();
        }
        if pod_subnet_v6.is_some() {
            let node_ipv6 = match conf.node_ipv6 {
                Some(ip) => ip,
                None => node
                    .primary_ipv6(index)
                    .await
                    .cni(ErrorCode::IO, "cannot list the uplink's addresses")?
                    .ok_or_else(|| {
                        invalid(format!("ipMasq: uplink {uplink} has no usable global IPv6 address"), "set nodeIPv6")
                    })?,
            };
            config.node_ipv6 = node_ipv6.octets();
        }
        let ports = conf.masq_ports()?;
        config.masquerade = 1;
        config.uplink_ifindex = index;
        config.port_min = *ports.start();
        config.port_max = *ports.end();
        config.pod_flows_per_minute = conf.masq_pod_flows_per_minute.unwrap_or(DEFAULT_MASQ_POD_FLOWS_PER_MINUTE);
        let map_entries = conf.service_map_entries.clone();
        Ok(Self { config, uplink: Some(uplink), log_level, socket_lb: conf.socket_lb_cgroup.clone(), map_entries })
    }
}

impl Settings {
    /// Says in the log what the node's sysctls mean for masquerading with these settings. Only
    /// when the datapath is about to be loaded, not on every ADD: each `/proc/sys` lookup walks
    /// the cached entries of every network namespace that looked there (`proc_sys_compare`),
    /// one per pod and more: about 160 µs each on a machine of 4,000 namespaces.
    pub fn warn_about_node(&self) {
        if self.config.masquerade == 0 {
            return;
        }
        warn_if_not_forwarding();
        warn_if_ports_shared(&(self.config.port_min..=self.config.port_max));
    }
}

async fn uplink(conf: &NetConf, node: &Netlink) -> CniResult<(String, u32)> {
    let name = match &conf.uplink {
        Some(name) => name.clone(),
        None => {
            let index = node
                .default_route_ifindex()
                .await
                .cni(ErrorCode::IO, "cannot list the node's routes")?
                .ok_or_else(|| invalid("ipMasq: the node has no IPv4 default route", "set uplink"))?;
            node.link_name(index)
                .await
                .cni(ErrorCode::IO, "cannot look up the default route's interface")?
                .ok_or_else(|| invalid("ipMasq: the default route's interface vanished", "set uplink"))?
        }
    };
    let link = node.link(&name).await.cni(ErrorCode::IO, "cannot look up the uplink")?;
    let link = link.ok_or_else(|| invalid(format!("uplink {name} does not exist in the node"), "fix uplink"))?;
    Ok((name, link.index))
}

/// Masqueraded and cross-node traffic leaves the pods through the node's forwarding path, as on
/// any Kubernetes node. The plugin does not change sysctls; it says so when forwarding is off.
fn warn_if_not_forwarding() {
    if std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").is_ok_and(|v| v.trim() == "0") {
        log::warn!("net.ipv4.ip_forward is 0 in the node: pods cannot reach the outside");
    }
}

/// What must match between a network's loaded settings and an ADD's: all but the node's pod
/// subnet, which is the first pod's (an IPAM with several subnets gives the next pod another).
pub fn comparable(config: &DatapathConfig) -> DatapathConfig {
    DatapathConfig {
        node_pods_ipv4: [0; 4],
        node_pods_prefix: 0,
        node_pods_ipv6: [0; 16],
        node_pods_prefix6: 0,
        ..*config
    }
}

/// Masquerade takes its ports as the node's own sockets take theirs, and a reply is the node's
/// or a pod's by its port: the two ranges must not meet. The plugin does not change sysctls.
fn warn_if_ports_shared(ports: &std::ops::RangeInclusive<u16>) {
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else { return };
    let mut bounds = text.split_whitespace().filter_map(|n| n.parse::<u16>().ok());
    let (Some(low), Some(high)) = (bounds.next(), bounds.next()) else { return };
    if *ports.start() <= high && low <= *ports.end() {
        log::warn!(
            "masqPortRange {}-{} overlaps the node's ephemeral ports {low}-{high} \
             (net.ipv4.ip_local_port_range): a node connection and a pod's may meet on one port",
            ports.start(),
            ports.end()
        );
    }
}

fn invalid(msg: impl Into<String>, details: &str) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg).with_details(details)
}

/// Human form, for the error that reports settings differing from the loaded ones.
pub struct Describe<'a>(pub &'a DatapathConfig);

impl fmt::Display for Describe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        write!(f, "clusterCIDR {}/{}", Ipv4Addr::from(c.cluster_ipv4), c.cluster_prefix)?;
        if c.cluster_prefix6 != 0 {
            write!(f, ",{}/{}", Ipv6Addr::from(c.cluster_ipv6), c.cluster_prefix6)?;
        }
        if c.masquerade == 0 {
            return write!(f, ", no masquerade");
        }
        let v6 = if c.node_ipv6 != [0; 16] { format!(" and {}", Ipv6Addr::from(c.node_ipv6)) } else { String::new() };
        write!(
            f,
            ", masquerade behind {}{v6} on ifindex {}, ports {}-{}, {} new flows per pod per minute",
            Ipv4Addr::from(c.node_ipv4),
            c.uplink_ifindex,
            c.port_min,
            c.port_max,
            c.pod_flows_per_minute
        )
    }
}
