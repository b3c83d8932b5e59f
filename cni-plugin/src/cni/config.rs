//! The network configuration the runtime writes on stdin.
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
    path::PathBuf,
};

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use log::LevelFilter;

use serde::Deserialize;
use serde_json::Value;

use super::{CniError, CniResult, ErrorCode, env::validate_container_id, version};

/// Where programs, maps and links are pinned unless the config says otherwise.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ebpf-cni";

/// Below Linux's default ephemeral ports (32768–60999) and Kubernetes' NodePorts (30000–32767),
/// above the well-known ports: the node's own connections never take one of these, and a node
/// service listening in it is seen by the socket lookup and its port never handed out. 28,976
/// ports per destination: with a closed connection's port free again after 10 s, about 2,900
/// new connections a second to one server, sustained.
pub const DEFAULT_MASQ_PORTS: RangeInclusive<u16> = 1_024..=29_999;

/// `NAT`'s capacity in flows, per minute: a pod may open a burst of tens of thousands of
/// connections (a load test, a crawler), but not churn the table faster than once a minute, so
/// another pod's flow that is idle for less than a minute is not evicted for it.
pub const DEFAULT_MASQ_POD_FLOWS_PER_MINUTE: u32 = ebpf_common::NAT_MAX_ENTRIES / 2;

/// Smallest MTU the kernel accepts for IPv4.
const MIN_MTU: u32 = 68;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Kept raw: its shape depends on `ipam.type` (ours, or a delegated plugin's own).
    pub ipam: Option<Value>,
    pub mtu: Option<u32>,
    /// Masquerade pod → outside traffic behind the node's address (in BPF; off by default, as
    /// in `bridge`). Kept optional so that the node file can tell "left out" from "false";
    /// read it with [`NetConf::masquerades`].
    pub ip_masq: Option<bool>,
    /// Pod addresses of all nodes, never masqueraded and forwarded between nodes as they are.
    /// Default: the subnet of the pod's address. Dual-stack as Kubernetes writes it, one CIDR
    /// per family: `"10.244.0.0/16,fd00:10:244::/56"`.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    /// The interface masqueraded traffic leaves by. Default: that of the node's default route.
    pub uplink: Option<String>,
    /// The address masqueraded traffic leaves with. Default: the uplink's primary IPv4 address.
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<Ipv4Addr>,
    /// The address masqueraded IPv6 traffic leaves with. Default: the uplink's first usable
    /// global IPv6 address.
    #[serde(rename = "nodeIPv6")]
    pub node_ipv6: Option<Ipv6Addr>,
    /// `"min-max"`: the ports masqueraded flows leave from.
    pub masq_port_range: Option<String>,
    /// New masqueraded flows one pod may open per minute (0: no limit), so one pod cannot churn
    /// the other pods' flows out of `NAT`. Default [`DEFAULT_MASQ_POD_FLOWS_PER_MINUTE`].
    pub masq_pod_flows_per_minute: Option<u32>,
    /// Root of our pins in bpffs; one directory per network below it.
    pub bpffs_root: Option<PathBuf>,
    /// Where the plugin's log lines go (appended), besides errors to stderr. Default: none.
    pub log_file: Option<PathBuf>,
    /// `off`, `error`, `warn`, `info` (one line per verb) or `debug`. Default: `error`, or
    /// `info` when `logFile` is set.
    pub log_level: Option<String>,
    /// Logs of the TC programs themselves (`ebpf-cni inspect logs`): `off` (the default, and
    /// free: the verifier drops the code), `error`, `warn`, `info` (new masqueraded flows),
    /// `debug` (every drop) or `trace`. Fixed when the network's programs are loaded.
    pub ebpf_log_level: Option<String>,
    /// The result of the plugins before us: CHECK and DEL get the cached ADD result here.
    pub prev_result: Option<Value>,
    /// Capabilities the runtime filled in (`ips`, `mac`); see [`super::request`].
    pub runtime_config: Option<Value>,
    /// `args.cni.ips` / `args.cni.mac` (the CNI conventions' per-attachment arguments).
    pub args: Option<Value>,
    /// The node file's `podCIDRs` (`node_conf.rs`): when set, every pod address must be in one.
    #[serde(skip)]
    pub allowed_pod_cidrs: Option<Vec<IpNetwork>>,
    /// Set when the node file names this network its primary one: the pod subnets its datapath
    /// is loaded with, and the only ones its IPAM may draw from (`node_conf.rs`).
    #[serde(skip)]
    pub node_subnets: Option<super::node_conf::NodeSubnets>,
    /// Set when the node file names this network its primary one and sets
    /// `kubeProxyReplacement`: the cgroup the socket LB's programs attach to (`cgroupRoot`).
    #[serde(skip)]
    pub socket_lb_cgroup: Option<PathBuf>,
    /// The node file's `serviceMapEntries` for its primary network: Service maps sized at load.
    #[serde(skip)]
    pub service_map_entries: Vec<(&'static str, u32)>,
    /// GC: the attachments that are still in use; everything else of this network goes.
    #[serde(rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<AttachmentRef>>,
    /// The same list under the key of spec 1.1's drafts, still sent by some runtimes.
    #[serde(rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<AttachmentRef>>,
}

/// One (container ID, interface name) pair of a GC request.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRef {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl NetConf {
    /// Parses and validates stdin. Unknown fields are ignored, as the spec asks.
    pub fn parse(raw: &[u8]) -> CniResult<Self> {
        let mut value: Value = serde_json::from_slice(raw)
            .map_err(|e| CniError::new(ErrorCode::DECODE, "network configuration is not valid JSON").with_details(e))?;
        let version = version::of_config(&value).unwrap_or_default();
        if !version::is_supported(&version) {
            return Err(CniError::new(
                ErrorCode::INCOMPATIBLE_VERSION,
                format!("cniVersion {version:?} is not supported"),
            )
            .with_details(format!("supported: {}", version::SUPPORTED.join(", "))));
        }
        if let Some(object) = value.as_object_mut() {
            object.insert("cniVersion".into(), Value::String(version));
        }
        let conf: NetConf = serde_json::from_value(value)
            .map_err(|e| CniError::new(ErrorCode::INVALID_CONFIG, "invalid network configuration").with_details(e))?;
        conf.validate()?;
        Ok(conf)
    }

    fn validate(&self) -> CniResult<()> {
        // A network name becomes a directory name (data dir, pins): same grammar as container IDs.
        validate_container_id(&self.name).map_err(|_| {
            invalid(format!("network name {:?} must match [a-zA-Z0-9][a-zA-Z0-9_.-]{{0,254}}", self.name))
        })?;
        if self.plugin_type.is_empty() {
            return Err(invalid("type is required"));
        }
        if let Some(mtu) = self.mtu.filter(|m| !(MIN_MTU..=65_535).contains(m)) {
            return Err(invalid(format!("mtu {mtu} is outside {MIN_MTU}..=65535")));
        }
        if self.ipam.is_none() {
            return Err(invalid("ipam is required: ebpf-cni gives every pod an address"));
        }
        self.cluster_cidr()?;
        self.masq_ports()?;
        self.log_level()?;
        self.ebpf_log_level()?;
        if self.log_file.as_ref().is_some_and(|f| !f.is_absolute()) {
            return Err(invalid("logFile must be an absolute path"));
        }
        if let Some(uplink) = self.uplink.as_deref().filter(|u| u.is_empty() || u.len() > 15 || u.contains('/')) {
            return Err(invalid(format!("uplink {uplink:?} is not an interface name")));
        }
        Ok(())
    }

    /// The IPv4 CIDR of `clusterCIDR`, if it has one.
    pub fn cluster_cidr(&self) -> CniResult<Option<Ipv4Network>> {
        Ok(self.cluster_cidrs()?.0)
    }

    /// The IPv6 CIDR of `clusterCIDR`, if it has one.
    pub fn cluster_cidr_v6(&self) -> CniResult<Option<Ipv6Network>> {
        Ok(self.cluster_cidrs()?.1)
    }

    fn cluster_cidrs(&self) -> CniResult<ClusterCidrs> {
        self.cluster_cidr.as_deref().map_or(Ok((None, None)), parse_cluster_cidr)
    }

    pub fn masq_ports(&self) -> CniResult<RangeInclusive<u16>> {
        self.masq_port_range.as_deref().map_or(Ok(DEFAULT_MASQ_PORTS), parse_masq_ports)
    }

    pub fn masquerades(&self) -> bool {
        self.ip_masq.unwrap_or(false)
    }

    pub fn log_level(&self) -> CniResult<LevelFilter> {
        let Some(text) = self.log_level.as_deref() else {
            return Ok(if self.log_file.is_some() { LevelFilter::Info } else { LevelFilter::Error });
        };
        crate::logging::parse_level(text)
            .ok_or_else(|| invalid(format!("logLevel {text:?} is not one of off, error, warn, info, debug")))
    }

    /// The value of aya-log's `AYA_LOG_LEVEL` global: 0 off, 1 error … 5 trace.
    pub fn ebpf_log_level(&self) -> CniResult<u8> {
        parse_ebpf_log_level(self.ebpf_log_level.as_deref().unwrap_or("off"))
    }

    /// GC's list of attachments in use, under whichever key the runtime used.
    pub fn gc_attachments(&self) -> Vec<AttachmentRef> {
        let mut all: Vec<AttachmentRef> =
            self.valid_attachments.iter().chain(&self.attachments).flatten().cloned().collect();
        all.sort();
        all.dedup();
        all
    }

    pub fn bpffs_root(&self) -> PathBuf {
        self.bpffs_root.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_BPFFS_ROOT))
    }
}

/// `clusterCIDR`'s CIDRs by family.
pub type ClusterCidrs = (Option<Ipv4Network>, Option<Ipv6Network>);

/// `clusterCIDR` split by family: one CIDR, or Kubernetes' comma-separated dual-stack form
/// (either order), each normalised to its network address whatever host bits were written.
pub fn parse_cluster_cidr(text: &str) -> CniResult<ClusterCidrs> {
    let (mut v4, mut v6) = (None, None);
    let bad = |why: String| invalid(format!("clusterCIDR {text:?}: {why}"));
    for part in text.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(bad("an empty element (expected \"<IPv4 CIDR>,<IPv6 CIDR>\")".into()));
        }
        let net: IpNetwork = part.parse().map_err(|e| bad(format!("{part:?} is not a CIDR: {e}")))?;
        let twice = match net {
            IpNetwork::V4(n) => v4.replace(Ipv4Network::new(n.network(), n.prefix()).expect("same prefix")).is_some(),
            IpNetwork::V6(n) => v6.replace(Ipv6Network::new(n.network(), n.prefix()).expect("same prefix")).is_some(),
        };
        if twice {
            return Err(bad("at most one CIDR per address family".into()));
        }
    }
    Ok((v4, v6))
}

/// `ebpfLogLevel` as aya-log's `AYA_LOG_LEVEL`: 0 off, 1 error … 5 trace.
pub fn parse_ebpf_log_level(text: &str) -> CniResult<u8> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let level = LEVELS
        .iter()
        .position(|l| *l == text)
        .ok_or_else(|| invalid(format!("ebpfLogLevel {text:?} is not one of {}", LEVELS.join(", "))))?;
    Ok(level as u8)
}

/// `masqPortRange`: `"min-max"`.
pub fn parse_masq_ports(text: &str) -> CniResult<RangeInclusive<u16>> {
    let bad = || invalid(format!("masqPortRange {text:?} must be \"min-max\" with 1 <= min <= max <= 65535"));
    let (min, max) = text.split_once('-').ok_or_else(bad)?;
    let (min, max): (u16, u16) = (min.trim().parse().map_err(|_| bad())?, max.trim().parse().map_err(|_| bad())?);
    if min == 0 || min > max {
        return Err(bad());
    }
    Ok(min..=max)
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> CniResult<NetConf> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn minimal_with_unknown_fields() {
        let c = parse(
            r#"{"cniVersion":"1.0.0","name":"n1","type":"ebpf-cni","ipam":{"type":"host-local"},"whatever":[1]}"#,
        )
        .unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(c.bpffs_root(), PathBuf::from(DEFAULT_BPFFS_ROOT));
        assert!(!c.masquerades());
        assert_eq!(c.masq_ports().unwrap(), DEFAULT_MASQ_PORTS);
        assert_eq!(c.log_level().unwrap(), LevelFilter::Error);
        assert_eq!(c.ebpf_log_level().unwrap(), 0);
    }

    #[test]
    fn log_settings() {
        let c = parse(
            r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"logFile":"/var/log/ebpf-cni.log",
                "ebpfLogLevel":"debug"}"#,
        )
        .unwrap();
        assert_eq!(c.log_level().unwrap(), LevelFilter::Info, "a log file without a level gets one line per verb");
        assert_eq!(c.ebpf_log_level().unwrap(), 4);
    }

    #[test]
    fn masquerade_settings() {
        let c = parse(
            r#"{"cniVersion":"1.1.0","name":"n","type":"ebpf-cni","ipam":{},"ipMasq":true,
                "clusterCIDR":"10.244.3.7/16","uplink":"eth1","nodeIP":"192.0.2.1","masqPortRange":"40000-40010"}"#,
        )
        .unwrap();
        assert_eq!(c.cluster_cidr().unwrap().unwrap().to_string(), "10.244.0.0/16");
        assert_eq!(c.masq_ports().unwrap(), 40_000..=40_010);
        assert_eq!(c.node_ip, Some(Ipv4Addr::new(192, 0, 2, 1)));
    }

    #[test]
    fn error_codes() {
        let cases = [
            ("{not json", ErrorCode::DECODE),
            (r#"{"cniVersion":"9.9.9","name":"n","type":"t","ipam":{}}"#, ErrorCode::INCOMPATIBLE_VERSION),
            (r#"{"name":"n","type":"t","ipam":{}}"#, ErrorCode::INCOMPATIBLE_VERSION),
            (r#"{"cniVersion":"1.0.0","name":"../x","type":"t","ipam":{}}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"mtu":10}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"mtu":"x"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#, ErrorCode::INVALID_CONFIG),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"clusterCIDR":"10.0.0.0/33"}"#,
                ErrorCode::INVALID_CONFIG,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"masqPortRange":"2-1"}"#,
                ErrorCode::INVALID_CONFIG,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"masqPortRange":"0-9"}"#,
                ErrorCode::INVALID_CONFIG,
            ),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"uplink":"a/b"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"nodeIP":"x"}"#, ErrorCode::INVALID_CONFIG),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"nodeIPv6":"10.0.0.1"}"#,
                ErrorCode::INVALID_CONFIG,
            ),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"logLevel":"loud"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"logFile":"x.log"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"ebpfLogLevel":"1"}"#, ErrorCode::INVALID_CONFIG),
        ];
        for (input, code) in cases {
            assert_eq!(parse(input).unwrap_err().code, code, "{input}");
        }
    }

    #[test]
    fn dual_stack_cluster_cidr() {
        let conf = |cidr: &str| {
            parse(&format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{{}},"clusterCIDR":"{cidr}"}}"#))
        };
        for text in ["10.244.3.7/16,fd00:10:244::1/56", "fd00:10:244::/56 , 10.244.0.0/16"] {
            let c = conf(text).unwrap();
            assert_eq!(c.cluster_cidr().unwrap().unwrap().to_string(), "10.244.0.0/16", "{text}");
            assert_eq!(c.cluster_cidr_v6().unwrap().unwrap().to_string(), "fd00:10:244::/56", "{text}");
        }
        let v6_only = conf("fd00::1/8").unwrap();
        assert_eq!(v6_only.cluster_cidr().unwrap(), None);
        assert_eq!(v6_only.cluster_cidr_v6().unwrap().unwrap().to_string(), "fd00::/8");
        assert_eq!(conf("10.244.0.0/16").unwrap().cluster_cidr_v6().unwrap(), None);
        for (text, why) in [
            ("10.244.0.0/16,10.245.0.0/16", "at most one CIDR per address family"),
            ("fd00::/8,fd01::/16", "at most one CIDR per address family"),
            ("10.244.0.0/16,", "an empty element"),
            ("", "an empty element"),
            ("10.244.0.0/16,banana", "\"banana\" is not a CIDR"),
            ("fd00::/129", "is not a CIDR"),
        ] {
            let err = conf(text).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_CONFIG, "{text}");
            assert!(err.msg.contains(why), "{text}: {}", err.msg);
        }
    }

    #[test]
    fn node_ipv6() {
        let c = parse(r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"nodeIPv6":"2001:db8::1"}"#).unwrap();
        assert_eq!(c.node_ipv6, Some("2001:db8::1".parse().unwrap()));
        assert_eq!(c.node_ip, None);
    }
}
