//! An IPAM plugin other than ours, executed from CNI_PATH with our environment and the same
//! configuration on stdin, as the spec's "IP allocation" section describes.
use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
};

use serde_json::Value;

use super::Allocation;
use crate::cni::{
    CniError, CniResult, Context, ErrorCode,
    env::CniEnv,
    result::{AddResult, IpConfig},
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

    /// CHECK, GC and STATUS are passed on as they are; the plugin answers for its own state.
    pub fn forward(&self, env: &CniEnv, command: &str) -> CniResult<()> {
        self.exec(env, command).map(drop)
    }

    /// Whether the plugin speaks `version` (an IPAM plugin older than spec 1.1.0 has no GC or
    /// STATUS, and asking would only fail).
    pub fn speaks(&self, env: &CniEnv, version: &str) -> CniResult<bool> {
        let reply = self.exec(env, "VERSION")?;
        let listed = reply.get("supportedVersions").and_then(Value::as_array);
        Ok(listed.is_some_and(|l| l.iter().any(|v| v.as_str() == Some(version))))
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

/// The allocation in a result of any version (see [`AddResult::from_json`]).
fn parse_result(json: &Value) -> CniResult<Allocation> {
    let result = AddResult::from_json(json)?;
    let ips = result.ips.into_iter().map(|ip| IpConfig { interface: None, ..ip }).collect();
    Ok(Allocation { ips, routes: result.routes, dns: result.dns })
}
