//! The built-in allocator: host-local's configuration, layout and round-robin order.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

use ipnetwork::{IpNetwork, Ipv4Network};
use serde::Deserialize;
use serde_json::Value;

use super::{
    Allocation,
    range::{Range, RangeConf, RangeSet},
    store::Store,
};
use crate::cni::{
    CniError, CniResult, ErrorCode,
    result::{IpConfig, Route},
};

const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(flatten)]
    legacy: RangeConf,
    ranges: Option<Vec<Vec<RangeConf>>>,
    #[serde(default)]
    routes: Vec<RouteConf>,
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct RouteConf {
    dst: String,
    gw: Option<String>,
}

#[derive(Debug)]
pub struct HostLocal {
    network: String,
    data_dir: PathBuf,
    sets: Vec<RangeSet>,
    routes: Vec<Route>,
}

impl HostLocal {
    pub fn from_conf(network: &str, ipam: &Value) -> CniResult<Self> {
        let conf: Conf = serde_json::from_value(ipam.clone())
            .map_err(|e| CniError::new(ErrorCode::INVALID_CONFIG, "invalid ipam configuration").with_details(e))?;
        let set_confs = match (conf.ranges, conf.legacy.subnet.is_some()) {
            (Some(ranges), _) if !ranges.is_empty() => ranges,
            (_, true) => vec![vec![conf.legacy]],
            _ => return Err(CniError::new(ErrorCode::INVALID_CONFIG, "ipam needs `ranges` or `subnet`")),
        };
        let sets = set_confs
            .iter()
            .map(|set| {
                if set.is_empty() {
                    return Err(CniError::new(ErrorCode::INVALID_CONFIG, "ipam range set is empty"));
                }
                set.iter().map(Range::resolve).collect::<CniResult<RangeSet>>()
            })
            .collect::<CniResult<Vec<_>>>()?;
        let routes = conf.routes.iter().map(parse_route).collect::<CniResult<_>>()?;
        Ok(Self {
            network: network.to_string(),
            data_dir: conf.data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            sets,
            routes,
        })
    }

    /// One address per range set, or nothing at all (a partial allocation is released).
    pub fn allocate(&self, id: &str, ifname: &str) -> CniResult<Allocation> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        let mut ips = Vec::new();
        for (index, set) in self.sets.iter().enumerate() {
            match next_free(&store, set, index) {
                Some((ip, range)) if store.reserve(ip, id, ifname, index)? => ips.push(IpConfig {
                    address: IpNetwork::V4(Ipv4Network::new(ip, range.subnet.prefix()).expect("valid prefix")),
                    gateway: Some(IpAddr::V4(range.gateway)),
                    interface: None,
                }),
                _ => {
                    store.release(id, ifname)?;
                    let ranges: Vec<String> = set.iter().map(|r| format!("{}-{}", r.start, r.end)).collect();
                    return Err(CniError::new(
                        ErrorCode::POOL_EXHAUSTED,
                        format!("no free address in range set {}", ranges.join(",")),
                    ));
                }
            }
        }
        Ok(Allocation { ips, routes: self.routes.clone(), dns: Value::Null })
    }

    pub fn release(&self, id: &str, ifname: &str) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        store.release(id, ifname).map(drop)
    }
}

/// Round-robin: the first free address after the last one handed out, wrapping once.
fn next_free<'a>(store: &Store, set: &'a RangeSet, index: usize) -> Option<(Ipv4Addr, &'a Range)> {
    let all =
        || set.iter().flat_map(|r| (u32::from(r.start)..=u32::from(r.end)).map(move |ip| (Ipv4Addr::from(ip), r)));
    let skip =
        store.last_reserved(index).and_then(|last| all().position(|(ip, _)| ip == last)).map_or(0, |pos| pos + 1);
    all().skip(skip).chain(all().take(skip)).find(|(ip, r)| r.is_allocatable(*ip) && !store.is_reserved(*ip))
}

fn parse_route(r: &RouteConf) -> CniResult<Route> {
    let bad = |what: &str| CniError::new(ErrorCode::INVALID_CONFIG, format!("route {what} is invalid"));
    Ok(Route {
        dst: r.dst.parse().map_err(|_| bad(&r.dst))?,
        gw: r.gw.as_deref().map(|g| g.parse().map_err(|_| bad(g))).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ipam(dir: &std::path::Path, extra: Value) -> HostLocal {
        let mut conf = json!({ "type": "host-local", "subnet": "10.9.0.0/29", "dataDir": dir });
        conf.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        HostLocal::from_conf("net", &conf).unwrap()
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ebpf-cni-ipam-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_robin_exhaustion_and_release() {
        let dir = tempdir();
        let ipam = ipam(&dir, json!({}));
        // /29: .1 gateway, .2–.6 free (5 addresses).
        let got: Vec<String> =
            (0..5).map(|i| ipam.allocate(&format!("c{i}"), "eth0").unwrap().ips[0].address.to_string()).collect();
        assert_eq!(got, ["10.9.0.2/29", "10.9.0.3/29", "10.9.0.4/29", "10.9.0.5/29", "10.9.0.6/29"]);
        let err = ipam.allocate("c9", "eth0").unwrap_err();
        assert_eq!(err.code, ErrorCode::POOL_EXHAUSTED);
        ipam.release("c1", "eth0").unwrap();
        ipam.release("c1", "eth0").unwrap();
        // Round-robin continues after .6 and wraps to the freed .3.
        assert_eq!(ipam.allocate("c10", "eth0").unwrap().ips[0].address.to_string(), "10.9.0.3/29");
        let content = std::fs::read_to_string(dir.join("net/10.9.0.3")).unwrap();
        assert_eq!(content, "c10\r\neth0");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
