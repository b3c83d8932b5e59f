//! The `nat` view: every masqueraded flow (both entries of it), and the pod it belongs to. A NAT
//! entry only records its owner, the attachment's cookie (a hash); the pod's address comes from
//! the owner's ENDPOINTS entries and its container from their host veth's alias.
use std::{collections::BTreeMap, net::IpAddr};

use anyhow::Result;
use aya::maps::HashMap;
use ebpf_common::{ENDPOINT_LINK_LOCAL, FlowKey, IpKey, NAT_EGRESS, NatEntry, names};
use serde::Serialize;

use super::{
    maps::{ip_of, short_id},
    programs::Interfaces,
    table::Row,
};
use crate::bpf::{
    Pins,
    read::{endpoint_entries, open_map},
};

#[derive(Serialize)]
pub struct NatRow {
    /// `egress` (pod → outside, source rewritten) or `reply` (outside → node, destination
    /// rewritten).
    direction: &'static str,
    protocol: &'static str,
    src: String,
    dst: String,
    /// What the rewritten address becomes.
    translated: String,
    /// The attachment's cookie, as DEL and GC match it.
    owner: String,
    idle_seconds: u64,
    /// The owner's pod address; none when the owner has no endpoint left.
    pod: Option<IpAddr>,
    /// The owner's container ID and interface, from its host veth's alias.
    container_id: Option<String>,
    ifname: Option<String>,
}

impl Row for NatRow {
    const HEADERS: &'static [&'static str] =
        &["DIR", "PROTO", "SOURCE", "DESTINATION", "REWRITTEN TO", "IDLE", "POD", "CONTAINER"];
    fn cells(&self) -> Vec<String> {
        // `-`: no pod owns the flow any more; `?`: its veth does not say whose it is.
        let container = match (&self.pod, &self.container_id) {
            (None, _) => "-",
            (Some(_), None) => "?",
            (Some(_), Some(id)) => short_id(id),
        };
        vec![
            self.direction.into(),
            self.protocol.into(),
            self.src.clone(),
            self.dst.clone(),
            self.translated.clone(),
            format!("{}s", self.idle_seconds),
            self.pod.map_or_else(|| "-".into(), |ip| ip.to_string()),
            container.into(),
        ]
    }
}

/// The flows, sorted; `interfaces` is read only when some flow has a pod to name.
pub fn rows(pins: &Pins, interfaces: impl FnOnce() -> Result<Interfaces>) -> Result<Vec<NatRow>> {
    let map: HashMap<_, FlowKey, NatEntry> = HashMap::try_from(open_map(pins, names::NAT)?)?;
    let flows: Vec<(FlowKey, NatEntry)> = map.iter().filter_map(Result::ok).collect();
    let mut pods: BTreeMap<u64, Vec<(IpAddr, u32)>> = BTreeMap::new();
    if !flows.is_empty() {
        for (key, ep) in endpoint_entries(pins)?.into_iter().filter(|(_, ep)| ep.flags & ENDPOINT_LINK_LOCAL == 0) {
            pods.entry(ep.owner).or_default().push((ip_of(&key), ep.host_ifindex));
        }
    }
    let names = if flows.iter().any(|(_, e)| pods.contains_key(&e.owner)) { Some(interfaces()?) } else { None };
    // The programs stamp entries with bpf_ktime_get_ns: CLOCK_MONOTONIC.
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    let now_ns = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
    let mut rows: Vec<NatRow> = flows
        .into_iter()
        .map(|(key, entry)| {
            let egress = entry.direction == NAT_EGRESS;
            // The pod's side of the flow: the source going out, what a reply is rewritten to.
            let pod_side = address(key.family, if egress { key.src_addr } else { entry.addr });
            let endpoint = pods
                .get(&entry.owner)
                .and_then(|eps| eps.iter().find(|(ip, _)| *ip == pod_side).or_else(|| eps.first()).copied());
            let (container_id, ifname) = endpoint.and_then(|(_, ifindex)| names.as_ref()?.attachment(ifindex)).unzip();
            NatRow {
                direction: if egress { "egress" } else { "reply" },
                protocol: match key.protocol {
                    6 => "tcp",
                    17 => "udp",
                    1 => "icmp",
                    58 => "icmpv6",
                    _ => "other",
                },
                src: endpoint_text(address(key.family, key.src_addr), key.src_port),
                dst: endpoint_text(address(key.family, key.dst_addr), key.dst_port),
                translated: endpoint_text(address(key.family, entry.addr), entry.port),
                owner: entry.owner.to_string(),
                idle_seconds: now_ns.saturating_sub(entry.last_seen_ns) / 1_000_000_000,
                pod: endpoint.map(|(ip, _)| ip),
                container_id,
                ifname,
            }
        })
        .collect();
    rows.sort_by(|a, b| (a.direction, &a.src, &a.dst).cmp(&(b.direction, &b.src, &b.dst)));
    Ok(rows)
}

/// An address of a `NAT` key or entry, in the key's family.
fn address(family: u8, addr: [u8; 16]) -> IpAddr {
    ip_of(&IpKey { family, pad: [0; 3], addr })
}

/// `addr:port`, with IPv6 addresses in brackets as in a URL.
fn endpoint_text(addr: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

#[cfg(test)]
mod tests {
    use super::{NatRow, Row as _};

    fn row(pod: Option<&str>, container_id: Option<&str>) -> NatRow {
        NatRow {
            direction: "egress",
            protocol: "udp",
            src: "10.0.0.2:4242".into(),
            dst: "198.51.100.10:53".into(),
            translated: "192.0.2.1:4242".into(),
            owner: "42".into(),
            idle_seconds: 1,
            pod: pod.map(|ip| ip.parse().unwrap()),
            container_id: container_id.map(String::from),
            ifname: container_id.map(|_| "eth0".into()),
        }
    }

    #[test]
    fn a_flow_names_its_pod_or_says_it_has_none() {
        let id = "0123456789abcdef".repeat(4);
        assert_eq!(row(Some("10.0.0.2"), Some(&id)).cells()[6..], ["10.0.0.2", "0123456789ab"]);
        assert_eq!(row(Some("10.0.0.2"), None).cells()[6..], ["10.0.0.2", "?"]);
        assert_eq!(row(None, None).cells()[6..], ["-", "-"]);
        let json = serde_json::to_value(row(None, None)).unwrap();
        assert!(json["pod"].is_null() && json["container_id"].is_null() && json["owner"] == "42", "{json}");
    }
}
