//! Rows of the map views: ENDPOINTS, METRICS and SETTINGS, read from their pins with
//! `bpf::read` (NAT, which names its pods from ENDPOINTS, is in `nat.rs`).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ebpf_common::{DatapathConfig, ENDPOINT_EGRESS_SHAPED, ENDPOINT_LINK_LOCAL, FAMILY_IPV6, IpKey};

use anyhow::Result;
use serde::Serialize;

use super::{programs::Interfaces, table::Row};
use crate::{
    attachment::ifb_name_of,
    bpf::{Pins, read},
    cni::bandwidth::Limit,
    net::netlink::format_mac,
};

/// The IPv4 address in a 16-byte address field.
pub(super) fn ipv4(addr: [u8; 16]) -> Ipv4Addr {
    Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3])
}

/// The address of an address-keyed map's key, whichever its family.
pub(super) fn ip_of(key: &IpKey) -> IpAddr {
    if key.family == FAMILY_IPV6 { IpAddr::V6(Ipv6Addr::from(key.addr)) } else { IpAddr::V4(ipv4(key.addr)) }
}

#[derive(Serialize)]
pub struct EndpointRow {
    ip: IpAddr,
    /// The pod's IPv6 link-local address: vouches for its link-local traffic, never a destination.
    link_local: bool,
    host_ifindex: u32,
    host_ifname: String,
    pod_mac: String,
    host_mac: String,
    /// The attachment's cookie (hash of container ID and ifname), as DEL and GC match it.
    owner: String,
    /// The pod's container ID and interface, from the host veth's alias.
    container_id: Option<String>,
    ifname: Option<String>,
    /// Bandwidth limits (`bandwidth` capability), as ADD recorded them; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    ingress_limit: Option<LimitRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    egress_limit: Option<LimitRow>,
    /// The IFB whose TBF holds the egress limit, when the entry sends the pod's packets through
    /// it (`ENDPOINT_EGRESS_SHAPED`). An egress limit without one is a pod's from before this
    /// flag, limited on its own interface only, where a packet socket can get past it.
    #[serde(skip_serializing_if = "Option::is_none")]
    egress_ifb: Option<String>,
}

#[derive(Serialize)]
struct LimitRow {
    rate_bits_per_second: u64,
    burst_bits: u64,
}

impl From<Limit> for LimitRow {
    fn from(l: Limit) -> Self {
        Self { rate_bits_per_second: l.rate, burst_bits: l.burst }
    }
}

/// `20M/400k`: rate in bit/s and burst in bits, with SI prefixes; `-` for no limit.
fn limit_cell(limit: &Option<LimitRow>) -> String {
    let si = |v: u64| match v {
        v if v >= 1_000_000_000 && v % 1_000_000 == 0 => format!("{}G", v as f64 / 1e9),
        v if v >= 1_000_000 && v % 1_000 == 0 => format!("{}M", v as f64 / 1e6),
        v if v >= 1_000 => format!("{}k", v as f64 / 1e3),
        v => v.to_string(),
    };
    limit.as_ref().map_or_else(|| "-".into(), |l| format!("{}/{}", si(l.rate_bits_per_second), si(l.burst_bits)))
}

impl Row for EndpointRow {
    const HEADERS: &'static [&'static str] =
        &["IP", "HOST VETH", "IFINDEX", "POD MAC", "GATEWAY MAC", "CONTAINER", "IFNAME", "INGRESS", "EGRESS"];
    fn cells(&self) -> Vec<String> {
        let container = self.container_id.as_deref().map_or("?", short_id);
        vec![
            self.ip.to_string(),
            self.host_ifname.clone(),
            self.host_ifindex.to_string(),
            self.pod_mac.clone(),
            self.host_mac.clone(),
            container.to_string(),
            self.ifname.clone().unwrap_or_else(|| "?".into()),
            limit_cell(&self.ingress_limit),
            match (&self.egress_limit, &self.egress_ifb) {
                (Some(_), None) => format!("{} (pod side only)", limit_cell(&self.egress_limit)),
                _ => limit_cell(&self.egress_limit),
            },
        ]
    }
}

/// A 64-digit hex container ID (containerd, CRI-O, podman) as `crictl ps` shows it: its first
/// twelve digits. Other IDs are shown whole.
pub(super) fn short_id(id: &str) -> &str {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) { &id[..12] } else { id }
}

pub fn endpoints(pins: &Pins, names: &Interfaces) -> Result<Vec<EndpointRow>> {
    let mut rows: Vec<EndpointRow> = read::endpoint_entries(pins)?
        .into_iter()
        .map(|(key, ep)| (key, ep, names.attachment(ep.host_ifindex).unzip(), names.limits(ep.host_ifindex)))
        .map(|(key, ep, (container_id, ifname), limits)| EndpointRow {
            ip: ip_of(&key),
            link_local: ep.flags & ENDPOINT_LINK_LOCAL != 0,
            host_ifindex: ep.host_ifindex,
            host_ifname: names.name(ep.host_ifindex),
            pod_mac: format_mac(ep.pod_mac),
            host_mac: format_mac(ep.host_mac),
            owner: ep.owner.to_string(),
            container_id,
            ifname,
            ingress_limit: limits.ingress.map(LimitRow::from),
            egress_limit: limits.egress.map(LimitRow::from),
            egress_ifb: (ep.flags & ENDPOINT_EGRESS_SHAPED != 0)
                .then(|| names.name(ep.host_ifindex))
                .map(|host| ifb_name_of(&host).unwrap_or_else(|| "?".into())),
        })
        .collect();
    rows.sort_by_key(|r| r.ip);
    Ok(rows)
}

#[derive(Serialize)]
pub struct CounterRow {
    reason: u32,
    name: &'static str,
    packets: u64,
    bytes: u64,
}

impl Row for CounterRow {
    const HEADERS: &'static [&'static str] = &["REASON", "NAME", "PACKETS", "BYTES"];
    fn cells(&self) -> Vec<String> {
        vec![self.reason.to_string(), self.name.into(), self.packets.to_string(), self.bytes.to_string()]
    }
}

pub fn counters(pins: &Pins) -> Result<Vec<CounterRow>> {
    let rows = read::drop_counters(pins)?.into_iter().map(|(reason, sum)| CounterRow {
        reason: reason as u32,
        name: reason.name(),
        packets: sum.packets,
        bytes: sum.bytes,
    });
    Ok(rows.collect())
}

#[derive(Serialize)]
pub struct SettingsRow {
    cluster_cidr: String,
    masquerade: bool,
    node_ip: Ipv4Addr,
    /// The node's IPv6 address IPv6 is masqueraded to; absent when IPv6 is not masqueraded.
    #[serde(skip_serializing_if = "Option::is_none")]
    node_ipv6: Option<Ipv6Addr>,
    uplink_ifindex: u32,
    uplink: String,
    masq_ports: String,
}

impl Row for SettingsRow {
    const HEADERS: &'static [&'static str] = &["CLUSTER CIDR", "MASQUERADE", "NODE IP", "UPLINK", "PORTS"];
    fn cells(&self) -> Vec<String> {
        let (node_ip, uplink, ports) = if self.masquerade {
            let node_ips = match self.node_ipv6 {
                Some(v6) => format!("{},{v6}", self.node_ip),
                None => self.node_ip.to_string(),
            };
            (node_ips, format!("{} ({})", self.uplink, self.uplink_ifindex), self.masq_ports.clone())
        } else {
            ("-".into(), "-".into(), "-".into())
        };
        vec![self.cluster_cidr.clone(), self.masquerade.to_string(), node_ip, uplink, ports]
    }
}

pub fn settings(pins: &Pins, names: &Interfaces) -> Result<Vec<SettingsRow>> {
    let c = read::settings(pins)?;
    Ok(vec![SettingsRow {
        cluster_cidr: cluster_cidrs(&c),
        masquerade: c.masquerade != 0,
        node_ip: Ipv4Addr::from(c.node_ipv4),
        node_ipv6: c.masquerades6().then(|| Ipv6Addr::from(c.node_ipv6)),
        uplink_ifindex: c.uplink_ifindex,
        uplink: if c.masquerade != 0 { names.name(c.uplink_ifindex) } else { String::new() },
        masq_ports: format!("{}-{}", c.port_min, c.port_max),
    }])
}

/// As `clusterCIDR` takes it: the IPv4 range, then the IPv6 one, comma-separated.
fn cluster_cidrs(c: &DatapathConfig) -> String {
    let v4 = format!("{}/{}", Ipv4Addr::from(c.cluster_ipv4), c.cluster_prefix);
    if c.cluster_prefix6 == 0 {
        return v4;
    }
    format!("{v4},{}/{}", Ipv6Addr::from(c.cluster_ipv6), c.cluster_prefix6)
}
