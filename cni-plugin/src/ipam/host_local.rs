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
    store::{Holder, Store},
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

    /// One address per range set, or nothing at all (a partial allocation is released). A
    /// requested address is used for the set it belongs to; the other sets go round-robin.
    pub fn allocate(&self, id: &str, ifname: &str, requested: &[IpAddr]) -> CniResult<Allocation> {
        let requested = self.assign_requests(requested)?;
        let store = Store::lock(&self.data_dir, &self.network)?;
        let mut ips = Vec::new();
        for (index, set) in self.sets.iter().enumerate() {
            let reserved = match requested[index] {
                Some(ip) => Some(reserve_requested(&store, set, ip, id, ifname, index)?),
                None => match next_free(&store, set, index) {
                    Some((ip, range)) if store.reserve(ip, id, ifname, index)? => Some((ip, range)),
                    _ => None,
                },
            };
            let Some((ip, range)) = reserved else {
                store.release(id, ifname)?;
                return Err(CniError::new(
                    ErrorCode::POOL_EXHAUSTED,
                    format!("no free address in range set {}", describe(set)),
                ));
            };
            ips.push(IpConfig {
                address: IpNetwork::V4(Ipv4Network::new(ip, range.subnet.prefix()).expect("valid prefix")),
                gateway: Some(IpAddr::V4(range.gateway)),
                interface: None,
            });
        }
        Ok(Allocation { ips, routes: self.routes.clone(), dns: Value::Null })
    }

    /// Which range set each requested address is for; one outside every set is an error.
    fn assign_requests(&self, requested: &[IpAddr]) -> CniResult<Vec<Option<Ipv4Addr>>> {
        let mut per_set = vec![None; self.sets.len()];
        for ip in requested {
            let IpAddr::V4(v4) = *ip else {
                return Err(CniError::new(
                    ErrorCode::UNSUPPORTED_FIELD,
                    format!("requested {ip}: IPv6 is not supported yet"),
                ));
            };
            let set = self.sets.iter().position(|set| set.iter().any(|r| r.is_allocatable(v4))).ok_or_else(|| {
                CniError::new(ErrorCode::INVALID_CONFIG, format!("requested address {v4} is in no IPAM range"))
            })?;
            if per_set[set].replace(v4).is_some() {
                return Err(CniError::new(
                    ErrorCode::INVALID_CONFIG,
                    format!("two requested addresses for the range set of {v4}"),
                ));
            }
        }
        Ok(per_set)
    }

    pub fn release(&self, id: &str, ifname: &str) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        store.release(id, ifname)?;
        store.remove_leftovers().map(drop)
    }

    /// CHECK: each address is reserved, and for this attachment.
    pub fn check(&self, id: &str, ifname: &str, ips: &[Ipv4Addr]) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        for ip in ips {
            match store.holder(*ip) {
                Some(holder) if holder.is(id, ifname) => {}
                Some(holder) => {
                    return Err(CniError::new(
                        ErrorCode::CHECK_FAILED,
                        format!("{ip} is reserved for {}, not for this attachment", holder.container_id),
                    ));
                }
                None => {
                    return Err(CniError::new(
                        ErrorCode::CHECK_FAILED,
                        format!("{ip} is not reserved in {}", self.data_dir.display()),
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn holders(&self) -> CniResult<Vec<Holder>> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        Ok(store.reservations()?.into_iter().map(|(_, h)| h).collect())
    }

    /// GC: releases every reservation whose holder `keep` rejects; returns those holders.
    pub fn collect_garbage(&self, keep: impl Fn(&Holder) -> bool) -> CniResult<Vec<Holder>> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        let mut stale = Vec::new();
        let mut first_err = store.remove_leftovers().err();
        for (ip, holder) in store.reservations()? {
            if keep(&holder) {
                continue;
            }
            match store.remove(ip) {
                Ok(()) => stale.push(holder),
                Err(e) => drop(first_err.get_or_insert(e)),
            }
        }
        first_err.map_or(Ok(stale), Err)
    }

    /// STATUS: the data dir takes writes and every range set has a free address.
    pub fn status(&self) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)
            .map_err(|e| not_available(format!("IPAM data dir: {}", e.msg)))?;
        store.probe_writable().map_err(|e| not_available(format!("IPAM data dir is not writable: {}", e.details)))?;
        for (index, set) in self.sets.iter().enumerate() {
            if next_free(&store, set, index).is_none() {
                return Err(not_available(format!("IP pool exhausted: no free address in {}", describe(set))));
            }
        }
        Ok(())
    }
}

/// `10.1.0.2-10.1.0.254,10.2.0.2-10.2.0.254`, as errors name a range set.
fn describe(set: &RangeSet) -> String {
    set.iter().map(|r| format!("{}-{}", r.start, r.end)).collect::<Vec<_>>().join(",")
}

fn not_available(msg: String) -> CniError {
    CniError::new(ErrorCode::NOT_AVAILABLE, msg)
}

/// A requested address: free, or already this attachment's (an ADD retried after a crash).
fn reserve_requested<'a>(
    store: &Store,
    set: &'a RangeSet,
    ip: Ipv4Addr,
    id: &str,
    ifname: &str,
    index: usize,
) -> CniResult<(Ipv4Addr, &'a Range)> {
    let range = set.iter().find(|r| r.is_allocatable(ip)).expect("assigned to this set");
    if store.reserve(ip, id, ifname, index)? {
        return Ok((ip, range));
    }
    match store.holder(ip) {
        Some(holder) if holder.is(id, ifname) => Ok((ip, range)),
        holder => {
            store.release(id, ifname)?;
            Err(CniError::new(
                ErrorCode::ADDRESS_TAKEN,
                format!(
                    "requested address {ip} is reserved for {}",
                    holder.map(|h| h.container_id).unwrap_or_default()
                ),
            ))
        }
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
            (0..5).map(|i| ipam.allocate(&format!("c{i}"), "eth0", &[]).unwrap().ips[0].address.to_string()).collect();
        assert_eq!(got, ["10.9.0.2/29", "10.9.0.3/29", "10.9.0.4/29", "10.9.0.5/29", "10.9.0.6/29"]);
        let err = ipam.allocate("c9", "eth0", &[]).unwrap_err();
        assert_eq!(err.code, ErrorCode::POOL_EXHAUSTED);
        ipam.release("c1", "eth0").unwrap();
        ipam.release("c1", "eth0").unwrap();
        // Round-robin continues after .6 and wraps to the freed .3.
        assert_eq!(ipam.allocate("c10", "eth0", &[]).unwrap().ips[0].address.to_string(), "10.9.0.3/29");
        let content = std::fs::read_to_string(dir.join("net/10.9.0.3")).unwrap();
        assert_eq!(content, "c10\r\neth0");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn torn_reservations_are_replaced_and_leftovers_removed() {
        let dir = tempdir().with_extension("torn");
        let ipam = ipam(&dir, json!({}));
        ipam.allocate("a", "eth0", &[]).unwrap();
        let net = dir.join("net");
        // .3 created but never written; a record of the last address cut short; a crashed
        // writer's temporary file.
        std::fs::write(net.join("10.9.0.3"), b"").unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), b"10.9.").unwrap();
        std::fs::write(net.join(".10.9.0.4.999.tmp"), b"x\r\neth0").unwrap();
        // Round-robin restarts at .2 (taken), so .3's torn file is the next and is replaced.
        assert_eq!(ipam.allocate("b", "eth0", &[]).unwrap().ips[0].address.to_string(), "10.9.0.3/29");
        assert_eq!(std::fs::read_to_string(net.join("10.9.0.3")).unwrap(), "b\r\neth0");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(), "10.9.0.3");
        ipam.release("b", "eth0").unwrap();
        let mut names: Vec<String> =
            std::fs::read_dir(&net).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["10.9.0.2", "last_reserved_ip.0", "lock"]);
        // A torn reservation is garbage to GC: nobody can hold it.
        std::fs::write(net.join("10.9.0.6"), b"\n").unwrap();
        assert_eq!(ipam.collect_garbage(|h| h.container_id == "a").unwrap().len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn requested_addresses_gc_and_status() {
        let dir = tempdir().with_extension("req");
        let _ = std::fs::remove_dir_all(&dir);
        let ipam = ipam(&dir, json!({}));
        let want = |s: &str| vec![s.parse::<IpAddr>().unwrap()];
        assert_eq!(ipam.allocate("a", "eth0", &want("10.9.0.5")).unwrap().ips[0].address.to_string(), "10.9.0.5/29");
        // The same attachment asking again (ADD retried) gets it; another does not.
        ipam.allocate("a", "eth0", &want("10.9.0.5")).unwrap();
        assert_eq!(ipam.allocate("b", "eth0", &want("10.9.0.5")).unwrap_err().code, ErrorCode::ADDRESS_TAKEN);
        assert_eq!(ipam.allocate("b", "eth0", &want("10.9.0.1")).unwrap_err().code, ErrorCode::INVALID_CONFIG);
        assert_eq!(ipam.allocate("b", "eth0", &want("10.8.0.2")).unwrap_err().code, ErrorCode::INVALID_CONFIG);
        ipam.allocate("b", "eth0", &[]).unwrap();
        ipam.check("a", "eth0", &["10.9.0.5".parse().unwrap()]).unwrap();
        assert!(ipam.check("b", "eth0", &["10.9.0.5".parse().unwrap()]).is_err());
        ipam.status().unwrap();
        let stale = ipam.collect_garbage(|h| h.container_id == "a").unwrap();
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].container_id, "b");
        for i in 0..4 {
            ipam.allocate(&format!("f{i}"), "eth0", &[]).unwrap();
        }
        assert_eq!(ipam.status().unwrap_err().code, ErrorCode::NOT_AVAILABLE);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
