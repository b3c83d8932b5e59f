//! The built-in allocator: host-local's configuration, layout and round-robin order.
use std::{net::IpAddr, path::PathBuf};

use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde_json::Value;

use super::{
    Allocation,
    range::{Range, RangeConf, RangeSet, ordinal, resolve_set},
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
        let sets = set_confs.iter().map(|set| resolve_set(set)).collect::<CniResult<Vec<_>>>()?;
        let routes = conf.routes.iter().map(parse_route).collect::<CniResult<_>>()?;
        Ok(Self {
            network: network.to_string(),
            data_dir: conf.data_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            sets,
            routes,
        })
    }

    /// One address per range set (so one IPv4 and one IPv6 address for a dual-stack `ranges`),
    /// or nothing at all (a partial allocation is released). A requested address is used for
    /// the set it belongs to; the other sets go round-robin.
    pub fn allocate(&self, id: &str, ifname: &str, requested: &[IpAddr]) -> CniResult<Allocation> {
        let requested = self.assign_requests(requested)?;
        let store = Store::lock(&self.data_dir, &self.network)?;
        let mut ips = Vec::new();
        for (index, set) in self.sets.iter().enumerate() {
            let reserved = match requested[index] {
                Some(ip) => Some(reserve_requested(&store, set, ip, id, ifname, index)?),
                None => match next_free(&store, set, index)? {
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
                address: IpNetwork::new(ip, range.subnet.prefix()).expect("the subnet's family and prefix"),
                gateway: Some(range.gateway),
                interface: None,
            });
        }
        let addresses: Vec<IpAddr> = ips.iter().map(|c| c.address.ip()).collect();
        store.record(id, ifname, &addresses)?;
        Ok(Allocation { ips, routes: self.routes.clone(), dns: Value::Null })
    }

    /// Which range set each requested address is for (so its family's); one outside every set
    /// is an error.
    fn assign_requests(&self, requested: &[IpAddr]) -> CniResult<Vec<Option<IpAddr>>> {
        let mut per_set = vec![None; self.sets.len()];
        for &ip in requested {
            let set = self.sets.iter().position(|set| set.iter().any(|r| r.is_allocatable(ip))).ok_or_else(|| {
                CniError::new(ErrorCode::INVALID_CONFIG, format!("requested address {ip} is in no IPAM range"))
            })?;
            if per_set[set].replace(ip).is_some() {
                return Err(CniError::new(
                    ErrorCode::INVALID_CONFIG,
                    format!("two requested addresses for the range set of {ip}"),
                ));
            }
        }
        Ok(per_set)
    }

    pub fn release(&self, id: &str, ifname: &str) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        store.release(id, ifname)?;
        store.remove_leftovers(false).map(drop)
    }

    pub fn drop_spares(&self) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        store
            .drop_spares()
            .map_err(|e| CniError::new(ErrorCode::IO, "cannot remove IPAM's spare files").with_details(e))
    }

    /// The addresses the attachment's record names (`record.rs`); None without one.
    pub fn recorded(&self, id: &str, ifname: &str) -> CniResult<Option<Vec<IpAddr>>> {
        Ok(Store::lock(&self.data_dir, &self.network)?.recorded(id, ifname))
    }

    /// CHECK: each address is reserved, and for this attachment.
    pub fn check(&self, id: &str, ifname: &str, ips: &[IpAddr]) -> CniResult<()> {
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

    /// Each range set's subnets, in order.
    pub fn subnets(&self) -> Vec<Vec<IpNetwork>> {
        self.sets.iter().map(|set| set.iter().map(|range| range.subnet).collect()).collect()
    }

    pub fn holders(&self) -> CniResult<Vec<Holder>> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        Ok(store.reservations()?.into_iter().map(|(_, h)| h).collect())
    }

    /// GC: releases every reservation whose holder `keep` rejects; returns those holders.
    pub fn collect_garbage(&self, keep: impl Fn(&Holder) -> bool) -> CniResult<Vec<Holder>> {
        let store = Store::lock(&self.data_dir, &self.network)?;
        let mut stale = Vec::new();
        let mut first_err = store.remove_leftovers(true).err();
        if let Err(e) = store.remove_records_where(|holder| !keep(holder)) {
            first_err.get_or_insert(e);
        }
        for (ip, holder) in store.reservations()? {
            if keep(&holder) {
                continue;
            }
            match store.remove(ip) {
                Ok(()) => stale.push(holder),
                Err(e) => drop(first_err.get_or_insert(e)),
            }
        }
        // Spares only speed up churn: GC, rare, leaves none.
        if let Err(e) = store.drop_spares() {
            first_err.get_or_insert(CniError::new(ErrorCode::IO, "cannot remove IPAM's spare files").with_details(e));
        }
        first_err.map_or(Ok(stale), Err)
    }

    /// STATUS: the data dir takes writes and every range set has a free address.
    pub fn status(&self) -> CniResult<()> {
        let store = Store::lock(&self.data_dir, &self.network)
            .map_err(|e| not_available(format!("IPAM data dir: {}", e.msg)))?;
        store.probe_writable().map_err(|e| not_available(format!("IPAM data dir is not writable: {}", e.details)))?;
        for (index, set) in self.sets.iter().enumerate() {
            let free = next_free(&store, set, index).map_err(|e| not_available(format!("IPAM data dir: {}", e.msg)))?;
            if free.is_none() {
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
    ip: IpAddr,
    id: &str,
    ifname: &str,
    index: usize,
) -> CniResult<(IpAddr, &'a Range)> {
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

/// Round-robin, as host-local: the first free address after the last one handed out, wrapping
/// once. With n reservation files, one of any n + 1 allocatable addresses is free, so the walk
/// gives up after that many: a /64 is never walked through, only its first few addresses. The
/// files are counted (a listing of the directory) only once the walk has met
/// `WALK_BEFORE_COUNTING` taken addresses: round-robin usually finds the first one free.
fn next_free<'a>(store: &Store, set: &'a RangeSet, index: usize) -> CniResult<Option<(IpAddr, &'a Range)>> {
    // Resume after the last address, or at the set's start when the set no longer holds it.
    let (k, from) = store
        .last_reserved(index)
        .and_then(|last| {
            let k = set.iter().position(|r| r.contains(last))?;
            // `last + 1` could overflow at the very end of IPv6: go on with the next range.
            Some(if ordinal(last) < set[k].ordinals().1 {
                (k, ordinal(last) + 1)
            } else {
                let next = (k + 1) % set.len();
                (next, set[next].ordinals().0)
            })
        })
        .unwrap_or((0, set[0].ordinals().0));
    let (r, (first, last)) = (&set[k], set[k].ordinals());
    let tail = (from..=last).map(move |n| (r.address(n), r));
    let others = set[k + 1..].iter().chain(&set[..k]).flat_map(|r| {
        let (first, last) = r.ordinals();
        (first..=last).map(move |n| (r.address(n), r))
    });
    let head = (first..from).map(move |n| (r.address(n), r));
    let mut candidates = None;
    for (walked, (ip, r)) in tail.chain(others).chain(head).filter(|(ip, r)| r.is_allocatable(*ip)).enumerate() {
        if walked >= WALK_BEFORE_COUNTING {
            let bound = match candidates {
                Some(bound) => bound,
                None => *candidates.insert(store.reservation_count()? + 1),
            };
            if walked >= bound {
                return Ok(None);
            }
        }
        if !store.is_reserved(ip) {
            return Ok(Some((ip, r)));
        }
    }
    Ok(None)
}

/// Taken addresses `next_free` steps over before it counts the reservations.
const WALK_BEFORE_COUNTING: usize = 64;

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
        // .3 created but never written; a record of the last address cut short; crashed
        // writers' temporary files, this build's and an earlier build's (beside the reservations).
        std::fs::write(net.join("10.9.0.3"), b"").unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), b"10.9.").unwrap();
        std::fs::write(net.join(".aside/.10.9.0.4.999.tmp"), b"x\r\neth0").unwrap();
        std::fs::write(net.join(".10.9.0.5.998.tmp"), b"x\r\neth0").unwrap();
        // Round-robin restarts at .2 (taken), so .3's torn file is the next and is replaced.
        assert_eq!(ipam.allocate("b", "eth0", &[]).unwrap().ips[0].address.to_string(), "10.9.0.3/29");
        assert_eq!(std::fs::read_to_string(net.join("10.9.0.3")).unwrap(), "b\r\neth0");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(), "10.9.0.3");
        ipam.release("b", "eth0").unwrap();
        // DEL removes the leftovers in `.aside/` (without listing the reservations), GC those
        // beside the reservations too.
        assert_eq!(
            names(&net),
            [".10.9.0.5.998.tmp", ".aside", "10.9.0.2", "attachments", "last_reserved_ip.0", "lock"]
        );
        // What is left in `.aside/` are the released files' inodes, kept for the next writes.
        assert!(names(&net.join(".aside")).iter().all(|n| n.starts_with("spare.")));
        // A torn reservation is garbage to GC: nobody can hold it.
        std::fs::write(net.join("10.9.0.6"), b"\n").unwrap();
        assert_eq!(ipam.collect_garbage(|h| h.container_id == "a").unwrap().len(), 1);
        assert_eq!(names(&net), [".aside", "10.9.0.2", "attachments", "last_reserved_ip.0", "lock"]);
        assert!(names(&net.join(".aside")).is_empty(), "GC drops the spares");
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

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    fn addresses(a: &Allocation) -> Vec<(String, String)> {
        a.ips.iter().map(|c| (c.address.to_string(), c.gateway.unwrap().to_string())).collect()
    }

    #[test]
    fn dual_stack_one_address_per_family() {
        let dir = tempdir().with_extension("dual");
        let ipam =
            ipam(&dir, json!({ "ranges": [[{ "subnet": "10.9.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]] }));
        let a = ipam.allocate("a", "eth0", &[]).unwrap();
        assert_eq!(
            addresses(&a),
            [("10.9.1.2/24".into(), "10.9.1.1".into()), ("fd00:10:244:1::2/64".into(), "fd00:10:244:1::1".into())]
        );
        assert!(matches!(a.ips[1].address, IpNetwork::V6(_)));
        let b = ipam.allocate("b", "eth0", &[]).unwrap();
        assert_eq!(b.ips[1].address.to_string(), "fd00:10:244:1::3/64");
        // host-local's names: the address's canonical text; one last_reserved_ip per set.
        let net = dir.join("net");
        assert_eq!(
            names(&net),
            [
                ".aside",
                "10.9.1.2",
                "10.9.1.3",
                "attachments",
                "fd00:10:244:1::2",
                "fd00:10:244:1::3",
                "last_reserved_ip.0",
                "last_reserved_ip.1",
                "lock"
            ]
        );
        assert_eq!(std::fs::read_to_string(net.join("fd00:10:244:1::2")).unwrap(), "a\r\neth0");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.1")).unwrap(), "fd00:10:244:1::3");
        let ips = |a: &Allocation| a.ips.iter().map(|c| c.address.ip()).collect::<Vec<_>>();
        ipam.check("a", "eth0", &ips(&a)).unwrap();
        assert_eq!(ipam.check("a", "eth0", &ips(&b)).unwrap_err().code, ErrorCode::CHECK_FAILED);

        // A requested IPv6 address goes to the IPv6 set; the IPv4 one is drawn as usual.
        let want = |s: &[&str]| s.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect::<Vec<_>>();
        let c = ipam.allocate("c", "eth0", &want(&["fd00:10:244:1::abcd"])).unwrap();
        assert_eq!(c.ips[0].address.to_string(), "10.9.1.4/24");
        assert_eq!(c.ips[1].address.to_string(), "fd00:10:244:1::abcd/64");
        let d = ipam.allocate("d", "eth0", &want(&["fd00:10:244:1::d", "10.9.1.100"])).unwrap();
        assert_eq!(addresses(&d)[0].0, "10.9.1.100/24");
        assert_eq!(addresses(&d)[1].0, "fd00:10:244:1::d/64");
        for (bad, code) in [
            (want(&["fd00:10:244:1::abcd"]), ErrorCode::ADDRESS_TAKEN),
            (want(&["fd00:10:244:2::5"]), ErrorCode::INVALID_CONFIG),
            (want(&["fd00:10:244:1::1"]), ErrorCode::INVALID_CONFIG),
            (want(&["fd00:10:244:1::5", "fd00:10:244:1::6"]), ErrorCode::INVALID_CONFIG),
        ] {
            assert_eq!(ipam.allocate("e", "eth0", &bad).unwrap_err().code, code, "{bad:?}");
        }
        // Round-robin resumes after the last address handed out, in each set.
        assert_eq!(ipam.allocate("e", "eth0", &[]).unwrap().ips[1].address.to_string(), "fd00:10:244:1::e/64");

        // IPv6 reservations are released and collected like IPv4 ones.
        ipam.release("a", "eth0").unwrap();
        assert!(!net.join("fd00:10:244:1::2").exists() && !net.join("10.9.1.2").exists());
        assert_eq!(ipam.holders().unwrap().len(), 8);
        let stale = ipam.collect_garbage(|h| h.container_id == "b").unwrap();
        assert_eq!(stale.len(), 6);
        assert_eq!(ipam.holders().unwrap().len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn release_follows_the_record_and_walks_without_one() {
        let dir = tempdir().with_extension("record");
        let ipam =
            ipam(&dir, json!({ "ranges": [[{ "subnet": "10.9.1.0/24" }], [{ "subnet": "fd00:10:244:1::/64" }]] }));
        let a = ipam.allocate("a", "eth0", &[]).unwrap();
        let ips: Vec<IpAddr> = a.ips.iter().map(|c| c.address.ip()).collect();
        assert_eq!(ipam.recorded("a", "eth0").unwrap(), Some(ips.clone()));
        // A record is a hint: an address it names that another attachment holds now stays.
        let net = dir.join("net");
        std::fs::write(net.join("10.9.1.2"), "other\r\neth0").unwrap();
        ipam.release("a", "eth0").unwrap();
        assert!(net.join("10.9.1.2").exists() && !net.join("fd00:10:244:1::2").exists());
        assert_eq!(ipam.recorded("a", "eth0").unwrap(), None);
        // An earlier build's reservation has no record: found by reading every reservation.
        std::fs::write(net.join("10.9.1.9"), "old\r\neth0").unwrap();
        ipam.release("old", "eth0").unwrap();
        assert!(!net.join("10.9.1.9").exists());
        // GC removes the records of the attachments it lets go.
        ipam.allocate("b", "eth0", &[]).unwrap();
        ipam.allocate("c", "eth0", &[]).unwrap();
        ipam.collect_garbage(|h| h.container_id != "b").unwrap();
        assert_eq!(ipam.recorded("b", "eth0").unwrap(), None);
        assert!(ipam.recorded("c", "eth0").unwrap().is_some());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn small_ipv6_ranges_are_exhausted() {
        let dir = tempdir().with_extension("v6small");
        // Two ranges in one set: 3 addresses of a /120 between rangeStart and rangeEnd, then the
        // /126's ::2 and ::3 (::0 is the network, ::1 the gateway).
        let ipam = ipam(
            &dir,
            json!({ "ranges": [[
                { "subnet": "fd00:1::/120", "rangeStart": "fd00:1::10", "rangeEnd": "fd00:1::12" },
                { "subnet": "fd00:2::/126" },
            ]] }),
        );
        let got: Vec<String> =
            (0..5).map(|i| ipam.allocate(&format!("c{i}"), "eth0", &[]).unwrap().ips[0].address.to_string()).collect();
        assert_eq!(got, ["fd00:1::10/120", "fd00:1::11/120", "fd00:1::12/120", "fd00:2::2/126", "fd00:2::3/126"]);
        assert_eq!(ipam.allocate("c9", "eth0", &[]).unwrap_err().code, ErrorCode::POOL_EXHAUSTED);
        assert_eq!(ipam.status().unwrap_err().code, ErrorCode::NOT_AVAILABLE);
        ipam.release("c1", "eth0").unwrap();
        // After the set's last address the walk wraps to its first range.
        assert_eq!(ipam.allocate("c10", "eth0", &[]).unwrap().ips[0].address.to_string(), "fd00:1::11/120");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_64_wraps_at_its_last_address() {
        let dir = tempdir().with_extension("v6wrap");
        // The very top of the address space: `last + 1` would overflow.
        let ipam = ipam(&dir, json!({ "ranges": [[{ "subnet": "ffff:ffff:ffff:ffff::/64" }]] }));
        let net = dir.join("net");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe").unwrap();
        let next = |id: &str| ipam.allocate(id, "eth0", &[]).unwrap().ips[0].address.to_string();
        assert_eq!(next("a"), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/64");
        assert_eq!(next("b"), "ffff:ffff:ffff:ffff::2/64");
        // Taken addresses after the last one are stepped over; the walk is bounded by the
        // number of reservations, not by the 2^64 addresses.
        for taken in ["ffff:ffff:ffff:ffff::3", "ffff:ffff:ffff:ffff::4"] {
            std::fs::write(net.join(taken), "x\r\neth0").unwrap();
        }
        assert_eq!(next("c"), "ffff:ffff:ffff:ffff::5/64");
        ipam.status().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mixed_family_sets_are_refused() {
        let conf =
            json!({ "type": "host-local", "ranges": [[{ "subnet": "10.9.1.0/24" }, { "subnet": "fd00::/64" }]] });
        assert_eq!(HostLocal::from_conf("net", &conf).unwrap_err().code, ErrorCode::INVALID_CONFIG);
        let v6_only = json!({ "type": "host-local", "subnet": "fd00::/64" });
        assert_eq!(HostLocal::from_conf("net", &v6_only).unwrap().sets[0][0].gateway.to_string(), "fd00::1");
    }
}
