//! A policy's `ports` entries as `POLICY_RULES` keys them: a protocol number, and a port prefix
//! (`port..=endPort` split into the fewest prefixes that cover it exactly).
use k8s_openapi::{api::networking::v1::NetworkPolicyPort, apimachinery::pkg::util::intstr::IntOrString};

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const SCTP: u8 = 132;

/// One `ports` entry, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    pub protocol: u8,
    pub ports: Ports,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ports {
    /// No `port`: every port of the protocol.
    All,
    /// `port` (and `endPort`): inclusive.
    Range(u16, u16),
    /// A named port: resolved against container ports.
    Named(String),
}

/// `TCP` (the default), `UDP`, `SCTP`.
pub fn protocol(name: Option<&str>) -> Result<u8, String> {
    match name.unwrap_or("TCP") {
        "TCP" => Ok(TCP),
        "UDP" => Ok(UDP),
        "SCTP" => Ok(SCTP),
        other => Err(format!("unknown protocol {other:?}")),
    }
}

impl PortSpec {
    pub fn parse(port: &NetworkPolicyPort) -> Result<Self, String> {
        let protocol = protocol(port.protocol.as_deref())?;
        let number = |n: i32| u16::try_from(n).ok().filter(|n| *n != 0).ok_or_else(|| format!("port {n} out of range"));
        let ports = match (&port.port, port.end_port) {
            (None, None) => Ports::All,
            (None, Some(_)) => return Err("endPort without port".into()),
            (Some(IntOrString::String(name)), None) => Ports::Named(name.clone()),
            (Some(IntOrString::String(name)), Some(_)) => return Err(format!("endPort with named port {name:?}")),
            (Some(IntOrString::Int(n)), None) => Ports::Range(number(*n)?, number(*n)?),
            (Some(IntOrString::Int(n)), Some(end)) => {
                let (first, last) = (number(*n)?, number(end)?);
                if last < first {
                    return Err(format!("endPort {last} below port {first}"));
                }
                Ports::Range(first, last)
            }
        };
        Ok(Self { protocol, ports })
    }
}

/// `first..=last` as port prefixes: (the port in network byte order, leading bits that count).
pub fn prefixes(first: u16, last: u16) -> Vec<([u8; 2], u32)> {
    let mut out = Vec::new();
    let (mut at, last) = (u32::from(first), u32::from(last));
    while at <= last {
        // The largest aligned block starting at `at` that ends within the range.
        let mut size = if at == 0 { 1 << 16 } else { 1 << at.trailing_zeros().min(16) };
        while at + size - 1 > last {
            size >>= 1;
        }
        out.push(((at as u16).to_be_bytes(), 16 - size.trailing_zeros()));
        at += size;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(prefixes: &[([u8; 2], u32)]) -> Vec<u16> {
        let mut ports: Vec<u16> = (0..=u16::MAX)
            .filter(|p| {
                prefixes.iter().any(|(be, bits)| {
                    let mask = if *bits == 0 { 0 } else { u16::MAX << (16 - bits) };
                    p & mask == u16::from_be_bytes(*be)
                })
            })
            .collect();
        ports.sort();
        ports
    }

    #[test]
    fn ranges_split_exactly() {
        for (first, last) in [(80, 80), (80, 81), (1, 65535), (1000, 2000), (32000, 32768), (65535, 65535)] {
            let p = prefixes(first, last);
            assert_eq!(covered(&p), (first..=last).collect::<Vec<_>>(), "{first}..={last}");
            assert!(p.len() <= 30, "{first}..={last}: {} prefixes", p.len());
        }
        assert_eq!(prefixes(80, 80), vec![(80u16.to_be_bytes(), 16)]);
        assert_eq!(prefixes(0, 65535), vec![([0, 0], 0)]);
    }

    #[test]
    fn ports_parse() {
        let port = |p: Option<IntOrString>, end: Option<i32>, proto: Option<&str>| NetworkPolicyPort {
            port: p,
            end_port: end,
            protocol: proto.map(String::from),
        };
        let parsed = PortSpec::parse(&port(Some(IntOrString::Int(80)), None, None)).unwrap();
        assert_eq!(parsed, PortSpec { protocol: TCP, ports: Ports::Range(80, 80) });
        let parsed = PortSpec::parse(&port(None, None, Some("UDP"))).unwrap();
        assert_eq!(parsed, PortSpec { protocol: UDP, ports: Ports::All });
        let parsed = PortSpec::parse(&port(Some(IntOrString::String("http".into())), None, Some("SCTP"))).unwrap();
        assert_eq!(parsed, PortSpec { protocol: SCTP, ports: Ports::Named("http".into()) });
        let parsed = PortSpec::parse(&port(Some(IntOrString::Int(80)), Some(90), None)).unwrap();
        assert_eq!(parsed.ports, Ports::Range(80, 90));
        for bad in [
            port(Some(IntOrString::Int(80)), Some(79), None),
            port(Some(IntOrString::Int(70000)), None, None),
            port(Some(IntOrString::Int(80)), None, Some("ICMP")),
            port(None, Some(80), None),
            port(Some(IntOrString::String("http".into())), Some(90), None),
        ] {
            assert!(PortSpec::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
