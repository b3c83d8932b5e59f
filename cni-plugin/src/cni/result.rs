//! The ADD result, written in the format of the version the configuration asked for
//! (runtimes on libcni ≤ 1.1 reject a 1.1.0 result to a 1.0.0 request), and read back from any
//! version's format (a delegated IPAM plugin's result, CHECK's `prevResult`).
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use super::{CniError, CniResult, ErrorCode, version};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    /// The netns path for interfaces inside the container; `None` on the host.
    pub sandbox: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with the subnet's prefix length, as host-local reports it.
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` (podman drops IPs without it).
    pub interface: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AddResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Value,
}

impl AddResult {
    pub fn to_json(&self, cni_version: &str) -> Value {
        let with_ip_version = version::result_has_ip_version(cni_version);
        let interfaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut v = json!({ "name": i.name, "mac": i.mac });
                if let Some(sandbox) = &i.sandbox {
                    v["sandbox"] = json!(sandbox);
                }
                v
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = json!({ "address": ip.address.to_string() });
                if with_ip_version {
                    v["version"] = json!(if ip.address.is_ipv4() { "4" } else { "6" });
                }
                if let Some(gw) = ip.gateway {
                    v["gateway"] = json!(gw.to_string());
                }
                if let Some(index) = ip.interface {
                    v["interface"] = json!(index);
                }
                v
            })
            .collect();
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut v = json!({ "dst": r.dst.to_string() });
                if let Some(gw) = r.gw {
                    v["gw"] = json!(gw.to_string());
                }
                v
            })
            .collect();
        let dns = if self.dns.is_object() { self.dns.clone() } else { json!({}) };
        json!({
            "cniVersion": cni_version,
            "interfaces": interfaces,
            "ips": ips,
            "routes": routes,
            "dns": dns,
        })
    }
}

impl AddResult {
    /// Reads a result of any version from 0.3.0 on: `ips[].version` is optional there and
    /// ignored, the address says its family. Results before 0.3.0 (`ip4`) are refused.
    pub fn from_json(json: &Value) -> CniResult<Self> {
        let bad = |what: String| CniError::new(ErrorCode::DECODE, format!("result: {what}"));
        if json.get("ip4").is_some() || json.get("ip6").is_some() {
            return Err(bad("formats before 0.3.0 (`ip4`) are not supported".into()));
        }
        let list = |key: &str| json.get(key).and_then(Value::as_array).into_iter().flatten();
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
        let interfaces = list("interfaces")
            .map(|i| {
                Ok(Interface {
                    name: text(i, "name").ok_or_else(|| bad("interface without name".into()))?,
                    mac: text(i, "mac").unwrap_or_default(),
                    sandbox: text(i, "sandbox").filter(|s| !s.is_empty()),
                })
            })
            .collect::<CniResult<_>>()?;
        let ips = list("ips")
            .map(|ip| {
                let address = text(ip, "address").ok_or_else(|| bad("ip without address".into()))?;
                Ok(IpConfig {
                    address: address.parse().map_err(|_| bad(format!("address {address:?}")))?,
                    gateway: text(ip, "gateway")
                        .map(|g| g.parse().map_err(|_| bad(format!("gateway {g:?}"))))
                        .transpose()?,
                    interface: ip.get("interface").and_then(Value::as_u64).map(|i| i as usize),
                })
            })
            .collect::<CniResult<_>>()?;
        let routes = list("routes")
            .map(|r| {
                let dst = text(r, "dst").ok_or_else(|| bad("route without dst".into()))?;
                Ok(Route {
                    dst: dst.parse().map_err(|_| bad(format!("route dst {dst:?}")))?,
                    gw: text(r, "gw").map(|g| g.parse().map_err(|_| bad(format!("route gw {g:?}")))).transpose()?,
                })
            })
            .collect::<CniResult<_>>()?;
        Ok(Self { interfaces, ips, routes, dns: json.get("dns").cloned().unwrap_or(Value::Null) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AddResult {
        AddResult {
            interfaces: vec![
                Interface { name: "ec0".into(), mac: "02:00:00:00:00:01".into(), sandbox: None },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:02".into(),
                    sandbox: Some("/run/netns/p".into()),
                },
            ],
            ips: vec![IpConfig {
                address: "10.1.0.5/24".parse().unwrap(),
                gateway: Some("10.1.0.1".parse().unwrap()),
                interface: Some(1),
            }],
            routes: vec![Route { dst: "0.0.0.0/0".parse().unwrap(), gw: Some("10.1.0.1".parse().unwrap()) }],
            dns: Value::Null,
        }
    }

    #[test]
    fn every_version_has_its_format() {
        for v in version::SUPPORTED {
            let j = sample().to_json(v);
            assert_eq!(j["cniVersion"], v);
            assert_eq!(j["ips"][0]["address"], "10.1.0.5/24");
            assert_eq!(j["ips"][0]["interface"], 1);
            assert_eq!(j["interfaces"][1]["sandbox"], "/run/netns/p");
            assert!(j["interfaces"][0].get("sandbox").is_none());
            assert_eq!(j["routes"][0]["gw"], "10.1.0.1");
            assert!(j["dns"].is_object());
            let has_version = j["ips"][0].get("version").is_some();
            assert_eq!(has_version, v.starts_with("0."), "{v}");
            assert_eq!(AddResult::from_json(&j).unwrap(), AddResult { dns: json!({}), ..sample() }, "{v}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [json!({"ip4": {}}), json!({"ips": [{"address": "x"}]}), json!({"routes": [{"gw": "1.1.1.1"}]})] {
            assert_eq!(AddResult::from_json(&bad).unwrap_err().code, ErrorCode::DECODE, "{bad}");
        }
    }
}
