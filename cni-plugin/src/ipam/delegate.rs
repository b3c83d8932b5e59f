//! An IPAM plugin other than ours, executed from CNI_PATH with our environment and the same
//! configuration on stdin, as the spec's "IP allocation" section describes.
use std::{
    io::Write,
    net::IpAddr,
    path::PathBuf,
    process::{Command, Stdio},
};

use serde_json::Value;

use super::Allocation;
use crate::cni::{
    CniError, CniResult, Context, ErrorCode,
    env::CniEnv,
    result::{IpConfig, Route},
};

pub struct Delegated {
    kind: String,
    conf: Vec<u8>,
}

impl Delegated {
    pub fn new(kind: &str, raw_conf: &[u8]) -> CniResult<Self> {
        // The type names a file in CNI_PATH: never a path of its own.
        if kind.contains('/') || kind.starts_with('.') {
            return Err(CniError::new(ErrorCode::INVALID_CONFIG, format!("ipam.type {kind:?} is not a plugin name")));
        }
        Ok(Self { kind: kind.to_string(), conf: raw_conf.to_vec() })
    }

    pub fn add(&self, env: &CniEnv) -> CniResult<Allocation> {
        let allocation = parse_result(&self.exec(env, "ADD")?)?;
        if allocation.ips.is_empty() {
            return Err(CniError::new(
                ErrorCode::INVALID_CONFIG,
                format!("IPAM plugin {} returned no address", self.kind),
            ));
        }
        Ok(allocation)
    }

    pub fn del(&self, env: &CniEnv) -> CniResult<()> {
        self.exec(env, "DEL").map(drop)
    }

    fn binary(&self, env: &CniEnv) -> CniResult<PathBuf> {
        env.path.iter().map(|dir| dir.join(&self.kind)).find(|p| p.is_file()).ok_or_else(|| {
            CniError::new(ErrorCode::INVALID_CONFIG, format!("IPAM plugin {:?} not found in CNI_PATH", self.kind))
        })
    }

    fn exec(&self, env: &CniEnv, command: &str) -> CniResult<Value> {
        let binary = self.binary(env)?;
        let mut child = Command::new(&binary)
            .env("CNI_COMMAND", command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .cni(ErrorCode::IO, format!("cannot run {}", binary.display()))?;
        child.stdin.take().expect("piped").write_all(&self.conf).cni(ErrorCode::IO, "cannot feed IPAM plugin")?;
        let output = child.wait_with_output().cni(ErrorCode::IO, "IPAM plugin did not finish")?;
        let json: Value = if output.stdout.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(&output.stdout)
                .cni(ErrorCode::DECODE, format!("{} printed invalid JSON", self.kind))?
        };
        if output.status.success() {
            return Ok(json);
        }
        let code = json.get("code").and_then(Value::as_u64).map_or(ErrorCode::INTERNAL, |c| ErrorCode(c as u32));
        let msg = json.get("msg").and_then(Value::as_str).unwrap_or("IPAM plugin failed");
        let details = json.get("details").and_then(Value::as_str).unwrap_or_default();
        Err(CniError::new(code, format!("{}: {msg}", self.kind)).with_details(details))
    }
}

/// Reads `ips`, `routes` and `dns` of a ≥0.3.0 result (older `ip4` results are not supported).
fn parse_result(json: &Value) -> CniResult<Allocation> {
    let bad = |what: &str| CniError::new(ErrorCode::DECODE, format!("IPAM result: {what}"));
    if json.get("ip4").is_some() {
        return Err(bad("results before 0.3.0 (`ip4`) are not supported"));
    }
    let ips = json
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|ip| {
            let address = ip.get("address").and_then(Value::as_str).ok_or_else(|| bad("ip without address"))?;
            Ok(IpConfig {
                address: address.parse().map_err(|_| bad(address))?,
                gateway: ip.get("gateway").and_then(Value::as_str).and_then(|g| g.parse::<IpAddr>().ok()),
                interface: None,
            })
        })
        .collect::<CniResult<Vec<_>>>()?;
    let routes = json
        .get("routes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| {
            Some(Route {
                dst: r.get("dst")?.as_str()?.parse().ok()?,
                gw: r.get("gw").and_then(Value::as_str).and_then(|g| g.parse().ok()),
            })
        })
        .collect();
    Ok(Allocation { ips, routes, dns: json.get("dns").cloned().unwrap_or(Value::Null) })
}
