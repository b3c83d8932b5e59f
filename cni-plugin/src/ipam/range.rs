//! host-local's range configuration (`ranges`, or the older top-level `subnet`), resolved into
//! concrete first/last/gateway addresses. IPv4 and IPv6 alike: addresses are compared and
//! stepped through as `u128`, so a /64 costs no more than a /24.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use serde::Deserialize;

use crate::cni::{CniError, CniResult, ErrorCode};

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeConf {
    pub subnet: Option<String>,
    pub range_start: Option<String>,
    pub range_end: Option<String>,
    pub gateway: Option<String>,
}

/// One allocatable range: every address from `start` to `end`, minus the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNetwork,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

/// The ranges one address is drawn from (the first with a free address wins); all of one
/// family, as the set yields one address of the result.
pub type RangeSet = Vec<Range>;

/// Resolves one of `ranges`' sets: not empty, and one family.
pub fn resolve_set(confs: &[RangeConf]) -> CniResult<RangeSet> {
    let set = confs.iter().map(Range::resolve).collect::<CniResult<RangeSet>>()?;
    let first = set.first().ok_or_else(|| invalid("ipam range set is empty"))?;
    if let Some(other) = set.iter().find(|r| r.subnet.is_ipv4() != first.subnet.is_ipv4()) {
        return Err(invalid(format!(
            "ipam range set mixes address families ({} and {}): use one set per family",
            first.subnet, other.subnet
        )));
    }
    Ok(set)
}

impl Range {
    pub fn resolve(conf: &RangeConf) -> CniResult<Self> {
        let raw = conf.subnet.as_deref().ok_or_else(|| invalid("ipam range has no subnet"))?;
        let net: IpNetwork =
            raw.parse().map_err(|e| invalid(format!("subnet {raw:?} is not a valid CIDR")).with_details(e))?;
        // Normalise `10.1.2.3/24` to `10.1.2.0/24` as host-local does.
        let subnet = IpNetwork::new(net.network(), net.prefix()).expect("prefix already valid");
        // host-local's limit: at least 4 addresses (a /30 or /126), so one is left beside the
        // network address, the gateway and IPv4's broadcast.
        let (bits, prefix): (u32, u32) = (if subnet.is_ipv4() { 32 } else { 128 }, subnet.prefix().into());
        if prefix > bits - 2 {
            return Err(invalid(format!("subnet {subnet} is too small: /{} is the smallest allowed", bits - 2)));
        }
        let network = ordinal(subnet.network());
        let last = network | (u128::MAX >> (128 - bits + prefix));
        let addr = |field: &str, value: &Option<String>, default: u128| -> CniResult<IpAddr> {
            let Some(raw) = value else { return Ok(address(&subnet, default)) };
            let family = if subnet.is_ipv4() { "IPv4" } else { "IPv6" };
            let ip: IpAddr = raw
                .parse()
                .ok()
                .filter(|ip: &IpAddr| ip.is_ipv4() == subnet.is_ipv4())
                .ok_or_else(|| invalid(format!("{field} {raw:?} is not an {family} address")))?;
            if !subnet.contains(ip) {
                return Err(invalid(format!("{field} {ip} is outside subnet {subnet}")));
            }
            Ok(ip)
        };
        // IPv6 has no broadcast address: its range ends at the subnet's last address.
        let default_end = if subnet.is_ipv4() { last - 1 } else { last };
        let range = Self {
            subnet,
            start: addr("rangeStart", &conf.range_start, network + 1)?,
            end: addr("rangeEnd", &conf.range_end, default_end)?,
            gateway: addr("gateway", &conf.gateway, network + 1)?,
        };
        if range.start > range.end {
            return Err(invalid(format!("rangeStart {} is after rangeEnd {}", range.start, range.end)));
        }
        Ok(range)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.subnet.is_ipv4() && (self.start..=self.end).contains(&ip)
    }

    /// Addresses handed to pods: the range without network address (IPv6's subnet-router
    /// anycast), IPv4's broadcast and the gateway.
    pub fn is_allocatable(&self, ip: IpAddr) -> bool {
        let broadcast = match self.subnet {
            IpNetwork::V4(net) => Some(IpAddr::V4(net.broadcast())),
            IpNetwork::V6(_) => None,
        };
        self.contains(ip) && ip != self.gateway && ip != self.subnet.network() && Some(ip) != broadcast
    }

    /// The range's addresses as numbers, for stepping through it.
    pub fn ordinals(&self) -> (u128, u128) {
        (ordinal(self.start), ordinal(self.end))
    }

    /// The address numbered `n` in this range's family.
    pub fn address(&self, n: u128) -> IpAddr {
        address(&self.subnet, n)
    }
}

pub fn ordinal(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4).into(),
        IpAddr::V6(v6) => v6.into(),
    }
}

fn address(family: &IpNetwork, n: u128) -> IpAddr {
    match family {
        IpNetwork::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).expect("an IPv4 ordinal"))),
        IpNetwork::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(subnet: &str) -> RangeConf {
        RangeConf { subnet: Some(subnet.into()), ..Default::default() }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_follow_host_local() {
        let r = Range::resolve(&range("10.1.2.3/24")).unwrap();
        assert_eq!(r.subnet.to_string(), "10.1.2.0/24");
        assert_eq!((r.start, r.end, r.gateway), (ip("10.1.2.1"), ip("10.1.2.254"), ip("10.1.2.1")));
        assert!(!r.is_allocatable(r.gateway));
        assert!(!r.is_allocatable(ip("fd00::2")));
    }

    #[test]
    fn ipv6_defaults_follow_host_local() {
        let r = Range::resolve(&range("fd00:10:244:1::7/64")).unwrap();
        assert_eq!(r.subnet.to_string(), "fd00:10:244:1::/64");
        assert_eq!(r.start, ip("fd00:10:244:1::1"));
        assert_eq!(r.gateway, ip("fd00:10:244:1::1"));
        // No broadcast: the last address is a pod's.
        assert_eq!(r.end, ip("fd00:10:244:1:ffff:ffff:ffff:ffff"));
        assert!(r.is_allocatable(r.end));
        assert!(r.is_allocatable(ip("fd00:10:244:1::2")));
        assert!(!r.is_allocatable(ip("fd00:10:244:1::1")));
        assert!(!r.is_allocatable(ip("fd00:10:244:2::2")));
        assert!(!r.is_allocatable(ip("10.1.2.2")));
        // The smallest: a /126 (4 addresses).
        let r = Range::resolve(&range("fd00::/126")).unwrap();
        assert_eq!((r.start, r.end), (ip("fd00::1"), ip("fd00::3")));
        let r = Range::resolve(&range("::/0")).unwrap();
        assert_eq!(r.end, ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn bad_ranges_are_invalid_config() {
        let cases = [
            range("10.1.2.0/33"),
            range("banana"),
            range("10.0.0.0/31"),
            range("fd00::/127"),
            range("fd00::/129"),
            RangeConf { range_start: Some("10.9.0.1".into()), ..range("10.1.2.0/24") },
            RangeConf {
                range_start: Some("10.1.2.9".into()),
                range_end: Some("10.1.2.3".into()),
                ..range("10.1.2.0/24")
            },
            RangeConf { gateway: Some("fd00::1".into()), ..range("10.1.2.0/24") },
            RangeConf { range_end: Some("10.1.2.9".into()), ..range("fd00::/64") },
            RangeConf { range_start: Some("fd01::1".into()), ..range("fd00::/64") },
            RangeConf::default(),
        ];
        for c in cases {
            assert_eq!(Range::resolve(&c).unwrap_err().code, ErrorCode::INVALID_CONFIG, "{c:?}");
        }
    }

    #[test]
    fn a_set_is_one_family() {
        assert_eq!(resolve_set(&[range("fd00::/64"), range("fd01::/64")]).unwrap().len(), 2);
        let mixed = resolve_set(&[range("10.1.2.0/24"), range("fd00::/64")]).unwrap_err();
        assert_eq!(mixed.code, ErrorCode::INVALID_CONFIG);
        assert!(mixed.msg.contains("mixes address families"), "{}", mixed.msg);
        assert_eq!(resolve_set(&[]).unwrap_err().code, ErrorCode::INVALID_CONFIG);
    }
}
