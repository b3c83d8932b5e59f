//! One event as the monitor shows it: a `MonitorEvent` from the ring buffer with its addresses,
//! verdict and reason spelled out, and its pod, peer and policy named (`naming.rs`).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ebpf_common::{
    DropReason, FAMILY_IPV4, FAMILY_IPV6, MONITOR_DROP, MONITOR_EGRESS, MONITOR_INGRESS, MONITOR_POLICY_ALLOWED,
    MONITOR_POLICY_DENIED, MonitorEvent,
};
use serde::Serialize;

/// A record of the ring buffer as the programs wrote it; `None` for one of another size (a
/// datapath of another build).
pub fn parse(bytes: &[u8]) -> Option<MonitorEvent> {
    if bytes.len() != size_of::<MonitorEvent>() {
        return None;
    }
    // SAFETY: `MonitorEvent` is plain `#[repr(C)]` data, any bytes of its size are one; the
    // read copes with the record's alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<MonitorEvent>()) })
}

#[derive(Debug, Serialize)]
pub struct Record {
    /// Wall-clock time, RFC 3339 in UTC, nanoseconds.
    pub time: String,
    /// `drop` or `policy`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `dropped`, `denied` or `allowed`.
    pub verdict: &'static str,
    /// The drop reason's name (`spoofed-source`, `policy-denied`, …); none for an allowed flow.
    pub reason: Option<&'static str>,
    /// The pod on this node the event is about: `namespace/name`, or its address unnamed.
    pub pod: Option<String>,
    pub pod_ip: Option<IpAddr>,
    /// `ingress` (into the pod) or `egress` (out of it), for policy verdicts.
    pub direction: Option<&'static str>,
    /// The other end: `namespace/name` of a known pod, else its address.
    pub peer: Option<String>,
    pub peer_ip: Option<IpAddr>,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or the protocol number; none for a frame that is not IP.
    pub protocol: Option<String>,
    pub src_ip: Option<IpAddr>,
    pub src_port: Option<u16>,
    pub dst_ip: Option<IpAddr>,
    pub dst_port: Option<u16>,
    /// The policy that allowed the flow: `namespace/name`, or `slot N` unnamed.
    pub policy: Option<String>,
    pub policy_slot: Option<u32>,
    /// The interface whose program decided.
    pub ifindex: u32,
    /// The packet's length in bytes.
    pub len: u32,
}

/// The verdict and type of an event kind.
pub fn verdict(kind: u8) -> (&'static str, &'static str) {
    match kind {
        MONITOR_POLICY_ALLOWED => ("policy", "allowed"),
        MONITOR_POLICY_DENIED => ("policy", "denied"),
        MONITOR_DROP => ("drop", "dropped"),
        _ => ("drop", "unknown"),
    }
}

pub fn reason(event: &MonitorEvent) -> Option<&'static str> {
    if event.kind == MONITOR_POLICY_ALLOWED {
        return None;
    }
    Some(DropReason::from_index(event.reason).map_or("unknown", DropReason::name))
}

pub fn direction(event: &MonitorEvent) -> Option<&'static str> {
    match event.direction {
        MONITOR_INGRESS => Some("ingress"),
        MONITOR_EGRESS => Some("egress"),
        _ => None,
    }
}

/// Source and destination addresses; none for a frame that is not IP.
pub fn addresses(event: &MonitorEvent) -> Option<(IpAddr, IpAddr)> {
    let address = |bytes: [u8; 16]| match event.family {
        FAMILY_IPV4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        FAMILY_IPV6 => Some(IpAddr::V6(Ipv6Addr::from(bytes))),
        _ => None,
    };
    Some((address(event.src_addr)?, address(event.dst_addr)?))
}

pub fn protocol(event: &MonitorEvent) -> Option<String> {
    if event.family != FAMILY_IPV4 && event.family != FAMILY_IPV6 {
        return None;
    }
    Some(match event.protocol {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        other => other.to_string(),
    })
}

/// Whether the protocol has ports (the programs fill them for these only).
pub fn has_ports(event: &MonitorEvent) -> bool {
    matches!(event.protocol, 6 | 17 | 132) && (event.family == FAMILY_IPV4 || event.family == FAMILY_IPV6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_the_events_size_parses_and_others_do_not() {
        let event =
            MonitorEvent { time_ns: 7, kind: MONITOR_DROP, family: FAMILY_IPV4, reason: 2, ..Default::default() };
        // SAFETY: reading the bytes of a plain struct.
        let bytes = unsafe { std::slice::from_raw_parts((&raw const event).cast::<u8>(), size_of::<MonitorEvent>()) };
        assert_eq!(parse(bytes), Some(event));
        assert_eq!(parse(&bytes[1..]), None);
        assert_eq!(reason(&event), Some("spoofed-source"));
    }

    #[test]
    fn addresses_follow_the_family() {
        let mut event = MonitorEvent { family: FAMILY_IPV4, ..Default::default() };
        event.src_addr[..4].copy_from_slice(&[10, 0, 0, 1]);
        event.dst_addr[..4].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(addresses(&event), Some(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())));
        event.family = 0;
        assert_eq!((addresses(&event), protocol(&event)), (None, None));
    }
}
