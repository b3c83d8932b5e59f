//! host-local's range configuration (`ranges`, or the older top-level `subnet`), resolved into
//! concrete first/last/gateway addresses.
use std::net::Ipv4Addr;

use ipnetwork::{IpNetwork, Ipv4Network};
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
    pub subnet: Ipv4Network,
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

/// The ranges one address is drawn from (the first with a free address wins).
pub type RangeSet = Vec<Range>;

impl Range {
    pub fn resolve(conf: &RangeConf) -> CniResult<Self> {
        let raw = conf.subnet.as_deref().ok_or_else(|| invalid("ipam range has no subnet"))?;
        let subnet: Ipv4Network = match raw.parse::<IpNetwork>() {
            Ok(IpNetwork::V4(net)) => net,
            Ok(IpNetwork::V6(_)) => {
                return Err(CniError::new(
                    ErrorCode::UNSUPPORTED_FIELD,
                    format!("subnet {raw}: IPv6 is not supported yet"),
                ));
            }
            Err(e) => return Err(invalid(format!("subnet {raw:?} is not a valid CIDR")).with_details(e)),
        };
        // Normalise `10.1.2.3/24` to `10.1.2.0/24` as host-local does.
        let subnet = Ipv4Network::new(subnet.network(), subnet.prefix()).expect("prefix already valid");
        if subnet.prefix() > 30 {
            return Err(invalid(format!("subnet {subnet} is too small: /30 is the smallest with a free address")));
        }
        let network = u32::from(subnet.network());
        let broadcast = u32::from(subnet.broadcast());
        let addr = |field: &str, value: &Option<String>, default: u32| -> CniResult<Ipv4Addr> {
            let Some(raw) = value else { return Ok(Ipv4Addr::from(default)) };
            let ip: Ipv4Addr = raw.parse().map_err(|_| invalid(format!("{field} {raw:?} is not an IPv4 address")))?;
            if !subnet.contains(ip) {
                return Err(invalid(format!("{field} {ip} is outside subnet {subnet}")));
            }
            Ok(ip)
        };
        let range = Self {
            subnet,
            start: addr("rangeStart", &conf.range_start, network + 1)?,
            end: addr("rangeEnd", &conf.range_end, broadcast - 1)?,
            gateway: addr("gateway", &conf.gateway, network + 1)?,
        };
        if range.start > range.end {
            return Err(invalid(format!("rangeStart {} is after rangeEnd {}", range.start, range.end)));
        }
        Ok(range)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.start..=self.end).contains(&ip)
    }

    /// Addresses handed to pods: the range without network, broadcast and gateway.
    pub fn is_allocatable(&self, ip: Ipv4Addr) -> bool {
        self.contains(ip) && ip != self.gateway && ip != self.subnet.network() && ip != self.subnet.broadcast()
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

    #[test]
    fn defaults_follow_host_local() {
        let r = Range::resolve(&range("10.1.2.3/24")).unwrap();
        assert_eq!(r.subnet.to_string(), "10.1.2.0/24");
        assert_eq!(r.start, Ipv4Addr::new(10, 1, 2, 1));
        assert_eq!(r.end, Ipv4Addr::new(10, 1, 2, 254));
        assert_eq!(r.gateway, Ipv4Addr::new(10, 1, 2, 1));
        assert!(!r.is_allocatable(r.gateway));
    }

    #[test]
    fn bad_ranges_are_invalid_config() {
        let cases = [
            range("10.1.2.0/33"),
            range("banana"),
            range("10.0.0.0/31"),
            RangeConf { range_start: Some("10.9.0.1".into()), ..range("10.1.2.0/24") },
            RangeConf {
                range_start: Some("10.1.2.9".into()),
                range_end: Some("10.1.2.3".into()),
                ..range("10.1.2.0/24")
            },
            RangeConf::default(),
        ];
        for c in cases {
            assert_eq!(Range::resolve(&c).unwrap_err().code, ErrorCode::INVALID_CONFIG, "{c:?}");
        }
        assert_eq!(Range::resolve(&range("fd00::/64")).unwrap_err().code, ErrorCode::UNSUPPORTED_FIELD);
    }
}
