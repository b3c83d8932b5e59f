//! Who an event is about. The pod: for a policy verdict the packet's source (egress) or
//! destination (ingress); for a drop the pod behind the interface whose program dropped it (its
//! host veth, found in `ENDPOINTS`), else whichever address is a pod of this node. Names come
//! from the agent's names file (`--policy-names`: pods by address, policies by slot), read again
//! when it changes; without it addresses and slot numbers are shown.
use std::{
    collections::HashMap,
    fs,
    net::{IpAddr, Ipv6Addr},
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use ebpf_common::{ENDPOINT_LINK_LOCAL, FAMILY_IPV6, IpKey, MONITOR_DROP, MONITOR_EGRESS, MonitorEvent};
use serde::Deserialize;

use super::{clock::WallClock, event, event::Record};
use crate::bpf::{Pins, read};

/// How often, at most, the names file's time stamp and `ENDPOINTS` are read again.
const REREAD_EVERY: Duration = Duration::from_secs(1);

/// The parts of the agent's names file the monitor uses (its `identities` are not needed).
#[derive(Default, Deserialize)]
struct NamesFile {
    #[serde(default)]
    policies: HashMap<String, String>,
    #[serde(default)]
    pods: HashMap<IpAddr, String>,
}

pub struct Names {
    pins: Pins,
    path: PathBuf,
    file: NamesFile,
    file_stamp: Option<SystemTime>,
    file_checked: Option<Instant>,
    /// Host veth ifindex → the addresses of the pod behind it, from `ENDPOINTS`.
    veths: HashMap<u32, Vec<IpAddr>>,
    veths_read: Option<Instant>,
}

impl Names {
    pub fn new(pins: Pins, path: PathBuf) -> Self {
        let mut names = Self {
            pins,
            path,
            file: NamesFile::default(),
            file_stamp: None,
            file_checked: None,
            veths: HashMap::new(),
            veths_read: None,
        };
        names.reread_veths();
        names
    }

    pub fn describe(&mut self, event: &MonitorEvent, clock: &WallClock) -> Record {
        self.refresh_file();
        let (kind, verdict) = event::verdict(event.kind);
        let addresses = event::addresses(event);
        let (pod_ip, peer_ip) = self.ends(event, addresses);
        let ports = event::has_ports(event);
        Record {
            time: humantime::format_rfc3339_nanos(clock.wall(event.time_ns)).to_string(),
            kind,
            verdict,
            reason: event::reason(event),
            pod: pod_ip.map(|ip| self.name_of(ip)),
            pod_ip,
            direction: event::direction(event),
            peer: peer_ip.map(|ip| self.name_of(ip)),
            peer_ip,
            protocol: event::protocol(event),
            src_ip: addresses.map(|(src, _)| src),
            src_port: ports.then_some(event.src_port),
            dst_ip: addresses.map(|(_, dst)| dst),
            dst_port: ports.then_some(event.dst_port),
            policy: (event.policy_slot != 0).then(|| self.policy_name(event.policy_slot)),
            policy_slot: (event.policy_slot != 0).then_some(event.policy_slot),
            ifindex: event.ifindex,
            len: event.len,
        }
    }

    /// The local pod's address and the peer's.
    fn ends(&mut self, event: &MonitorEvent, addresses: Option<(IpAddr, IpAddr)>) -> (Option<IpAddr>, Option<IpAddr>) {
        if event.kind != MONITOR_DROP {
            let Some((src, dst)) = addresses else { return (None, None) };
            return if event.direction == MONITOR_EGRESS { (Some(src), Some(dst)) } else { (Some(dst), Some(src)) };
        }
        let behind = self.pod_behind(event.ifindex, event.family);
        let Some((src, dst)) = addresses else { return (behind.first().copied(), None) };
        if behind.is_empty() {
            // Not a host veth (the uplink): the pod is whichever end is one of this node's.
            return if self.is_local(dst) {
                (Some(dst), Some(src))
            } else {
                (self.is_local(src).then_some(src), Some(dst))
            };
        }
        if behind.contains(&dst) {
            return (Some(dst), Some(src));
        }
        // Sent by the pod, maybe from an address not its own (a spoofed source).
        let own = if behind.contains(&src) { src } else { behind[0] };
        (Some(own), Some(dst))
    }

    /// The addresses of the pod behind host veth `ifindex`, of the event's family first.
    fn pod_behind(&mut self, ifindex: u32, family: u8) -> Vec<IpAddr> {
        if !self.veths.contains_key(&ifindex) && self.veths_read.is_none_or(|at| at.elapsed() >= REREAD_EVERY) {
            self.reread_veths();
        }
        let mut addresses = self.veths.get(&ifindex).cloned().unwrap_or_default();
        addresses.sort_by_key(|ip| ip.is_ipv6() != (family == FAMILY_IPV6));
        addresses
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        self.veths.values().any(|addresses| addresses.contains(&ip))
    }

    fn reread_veths(&mut self) {
        self.veths_read = Some(Instant::now());
        let Ok(entries) = read::endpoint_entries(&self.pins) else { return };
        self.veths.clear();
        for (key, endpoint) in entries.iter().filter(|(_, e)| e.flags & ENDPOINT_LINK_LOCAL == 0) {
            self.veths.entry(endpoint.host_ifindex).or_default().push(ip_of(key));
        }
    }

    fn name_of(&self, ip: IpAddr) -> String {
        self.file.pods.get(&ip).cloned().unwrap_or_else(|| ip.to_string())
    }

    fn policy_name(&self, slot: u32) -> String {
        self.file.policies.get(&slot.to_string()).cloned().unwrap_or_else(|| format!("slot {slot}"))
    }

    /// Reads the names file again if its time stamp moved (checked once a second at most). A
    /// file that cannot be read or parsed leaves the names as they were.
    fn refresh_file(&mut self) {
        if self.file_checked.is_some_and(|at| at.elapsed() < REREAD_EVERY) {
            return;
        }
        self.file_checked = Some(Instant::now());
        let Ok(stamp) = fs::metadata(&self.path).and_then(|m| m.modified()) else { return };
        if self.file_stamp == Some(stamp) {
            return;
        }
        let Ok(text) = fs::read(&self.path) else { return };
        match serde_json::from_slice(&text) {
            Ok(file) => {
                self.file = file;
                self.file_stamp = Some(stamp);
            }
            Err(e) => eprintln!("ebpf-cni monitor: cannot parse {}: {e}", self.path.display()),
        }
    }
}

fn ip_of(key: &IpKey) -> IpAddr {
    if key.family == FAMILY_IPV6 {
        IpAddr::V6(Ipv6Addr::from(key.addr))
    } else {
        IpAddr::from([key.addr[0], key.addr[1], key.addr[2], key.addr[3]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_file_parses_as_the_agent_writes_it() {
        let text = r#"{"policies": {"3": "x/deny-all"},
            "identities": {"256": {"namespace": "x", "labels": {"pod": "a"}}},
            "pods": {"10.0.0.5": "x/a", "fd00::5": "x/a"}}"#;
        let file: NamesFile = serde_json::from_str(text).unwrap();
        assert_eq!(file.policies["3"], "x/deny-all");
        assert_eq!(file.pods[&"fd00::5".parse::<IpAddr>().unwrap()], "x/a");
    }
}
