//! What the runtime asks of one attachment beyond the network's configuration: fixed addresses,
//! a MAC and bandwidth limits. Three places may say it, as the CNI conventions describe:
//! `runtimeConfig` (the `ips`, `mac` and `bandwidth` capabilities), `args.cni`, and `CNI_ARGS`
//! (`IP=`, `MAC=`; podman sends both when it reloads a network and wants the old address back).
use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use serde_json::Value;

use super::{CniError, CniResult, ErrorCode, bandwidth::Bandwidth, config::NetConf, env::invalid};

/// A veth's MTU when the configuration sets none.
const DEFAULT_MTU: u32 = 1500;

/// CNI_ARGS keys we act on, or that runtimes always send (kubelet's pod identity).
const KNOWN_ARGS: [&str; 7] =
    ["IgnoreUnknown", "IP", "MAC", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID"];

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Addresses asked for, at most one per IPAM range set.
    pub ips: Vec<IpAddr>,
    pub mac: Option<[u8; 6]>,
    pub bandwidth: Bandwidth,
}

impl Request {
    /// Gathers the request; an unknown CNI_ARGS key fails with code 4 unless `IgnoreUnknown`
    /// is set, as the reference plugins do.
    pub fn gather(args: &BTreeMap<String, String>, conf: &NetConf) -> CniResult<Self> {
        let ignore_unknown = args.get("IgnoreUnknown").is_some_and(|v| matches!(v.as_str(), "1" | "true" | "True"));
        if let Some(key) = args.keys().find(|k| !KNOWN_ARGS.contains(&k.as_str())).filter(|_| !ignore_unknown) {
            return Err(
                invalid(format!("CNI_ARGS key {key:?} is unknown")).with_details("set IgnoreUnknown=1 to allow it")
            );
        }
        let runtime = conf.runtime_config.as_ref();
        let from_args = conf.args.as_ref().and_then(|a| a.get("cni"));
        let mut ips = Vec::new();
        let listed = [runtime.and_then(|r| r.get("ips")), from_args.and_then(|a| a.get("ips"))];
        for text in listed.into_iter().flatten().filter_map(Value::as_array).flatten() {
            let text = text.as_str().ok_or_else(|| bad_conf("ips entries must be strings"))?;
            ips.push(parse_ip(text).ok_or_else(|| bad_conf(format!("requested IP {text:?} is not an address")))?);
        }
        for text in args.get("IP").into_iter().flat_map(|v| v.split(',')).filter(|t| !t.is_empty()) {
            ips.push(parse_ip(text).ok_or_else(|| invalid(format!("CNI_ARGS IP={text:?} is not an address")))?);
        }
        ips.dedup();
        let conf_mac = [runtime.and_then(|r| r.get("mac")), from_args.and_then(|a| a.get("mac"))]
            .into_iter()
            .flatten()
            .find_map(Value::as_str);
        let mac = match (conf_mac, args.get("MAC")) {
            (Some(text), _) => {
                Some(parse_mac(text).ok_or_else(|| bad_conf(format!("mac {text:?} is not a unicast MAC")))?)
            }
            (None, Some(text)) => {
                Some(parse_mac(text).ok_or_else(|| invalid(format!("CNI_ARGS MAC={text:?} is not a unicast MAC")))?)
            }
            (None, None) => None,
        };
        let bandwidth = Bandwidth::parse(runtime.and_then(|r| r.get("bandwidth")), conf.mtu.unwrap_or(DEFAULT_MTU))?;
        Ok(Self { ips, mac, bandwidth })
    }
}

/// `10.1.0.5` or, as `runtimeConfig.ips` often carries it, `10.1.0.5/24`.
fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().or_else(|| text.parse::<IpNetwork>().ok().map(|n| n.ip()))
}

/// `aa:bb:cc:dd:ee:ff`, unicast and not all zeros: what a veth will take.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> =
        text.split(':').map(|p| u8::from_str_radix(p, 16).ok().filter(|_| p.len() == 2)).collect::<Option<_>>()?;
    let mac: [u8; 6] = bytes.try_into().ok()?;
    (mac[0] & 1 == 0 && mac != [0; 6]).then_some(mac)
}

fn bad_conf(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        NetConf::parse(format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{{}}{extra}}}"#).as_bytes())
            .unwrap()
    }

    fn args(raw: &[(&str, &str)]) -> BTreeMap<String, String> {
        raw.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn gathers_from_every_source() {
        let c = conf(
            r#","runtimeConfig":{"ips":["10.1.0.5/24"],"mac":"02:00:00:00:00:09"},"args":{"cni":{"ips":["10.2.0.5"]}}"#,
        );
        let r = Request::gather(&args(&[("IP", "10.3.0.5")]), &c).unwrap();
        assert_eq!(r.ips, ["10.1.0.5", "10.2.0.5", "10.3.0.5"].map(|s| s.parse::<IpAddr>().unwrap()));
        assert_eq!(r.mac, Some([2, 0, 0, 0, 0, 9]));
        let podman = Request::gather(
            &args(&[("IgnoreUnknown", "1"), ("IP", "10.9.0.7"), ("MAC", "0a:58:0a:09:00:07")]),
            &conf(""),
        )
        .unwrap();
        assert_eq!(podman.mac, Some([0x0a, 0x58, 0x0a, 9, 0, 7]));
    }

    #[test]
    fn unknown_keys_and_bad_values() {
        let c = conf("");
        assert_eq!(Request::gather(&args(&[("FOO", "1")]), &c).unwrap_err().code, ErrorCode::INVALID_ENV);
        assert!(Request::gather(&args(&[("FOO", "1"), ("IgnoreUnknown", "true")]), &c).is_ok());
        assert!(Request::gather(&args(&[("K8S_POD_NAME", "web-0")]), &c).is_ok());
        assert_eq!(Request::gather(&args(&[("IP", "x")]), &c).unwrap_err().code, ErrorCode::INVALID_ENV);
        assert_eq!(
            Request::gather(&args(&[("MAC", "01:00:00:00:00:01")]), &c).unwrap_err().code,
            ErrorCode::INVALID_ENV
        );
        let bad = conf(r#","runtimeConfig":{"mac":"zz"}"#);
        assert_eq!(Request::gather(&args(&[]), &bad).unwrap_err().code, ErrorCode::INVALID_CONFIG);
    }
}
