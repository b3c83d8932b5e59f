//! The network configuration the runtime writes on stdin.
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::{CniError, CniResult, ErrorCode, env::validate_container_id, version};

/// Where programs, maps and links are pinned unless the config says otherwise.
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/ebpf-cni";

/// Smallest MTU the kernel accepts for IPv4.
const MIN_MTU: u32 = 68;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// Kept raw: its shape depends on `ipam.type` (ours, or a delegated plugin's own).
    pub ipam: Option<Value>,
    pub mtu: Option<u32>,
    #[serde(default)]
    pub ip_masq: bool,
    /// Root of our pins in bpffs; one directory per network below it.
    pub bpffs_root: Option<PathBuf>,
}

impl NetConf {
    /// Parses and validates stdin. Unknown fields are ignored, as the spec asks.
    pub fn parse(raw: &[u8]) -> CniResult<Self> {
        let value: Value = serde_json::from_slice(raw)
            .map_err(|e| CniError::new(ErrorCode::DECODE, "network configuration is not valid JSON").with_details(e))?;
        let version = value.get("cniVersion").and_then(Value::as_str).unwrap_or_default();
        if !version::is_supported(version) {
            return Err(CniError::new(
                ErrorCode::INCOMPATIBLE_VERSION,
                format!("cniVersion {version:?} is not supported"),
            )
            .with_details(format!("supported: {}", version::SUPPORTED.join(", "))));
        }
        let conf: NetConf = serde_json::from_value(value)
            .map_err(|e| CniError::new(ErrorCode::INVALID_CONFIG, "invalid network configuration").with_details(e))?;
        conf.validate()?;
        Ok(conf)
    }

    fn validate(&self) -> CniResult<()> {
        // A network name becomes a directory name (data dir, pins): same grammar as container IDs.
        validate_container_id(&self.name)
            .map_err(|_| invalid(format!("network name {:?} must match [a-zA-Z0-9][a-zA-Z0-9_.-]*", self.name)))?;
        if self.plugin_type.is_empty() {
            return Err(invalid("type is required"));
        }
        if let Some(mtu) = self.mtu.filter(|m| !(MIN_MTU..=65_535).contains(m)) {
            return Err(invalid(format!("mtu {mtu} is outside {MIN_MTU}..=65535")));
        }
        if self.ipam.is_none() {
            return Err(invalid("ipam is required: ebpf-cni gives every pod an address"));
        }
        if self.ip_masq {
            return Err(CniError::new(ErrorCode::UNSUPPORTED_FIELD, "ipMasq: true is not supported yet")
                .with_details("BPF masquerade is planned; set ipMasq to false"));
        }
        Ok(())
    }

    pub fn bpffs_root(&self) -> PathBuf {
        self.bpffs_root.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_BPFFS_ROOT))
    }
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> CniResult<NetConf> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn minimal_with_unknown_fields() {
        let c = parse(
            r#"{"cniVersion":"1.0.0","name":"n1","type":"ebpf-cni","ipam":{"type":"host-local"},"whatever":[1]}"#,
        )
        .unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(c.bpffs_root(), PathBuf::from(DEFAULT_BPFFS_ROOT));
    }

    #[test]
    fn error_codes() {
        let cases = [
            ("{not json", ErrorCode::DECODE),
            (r#"{"cniVersion":"9.9.9","name":"n","type":"t","ipam":{}}"#, ErrorCode::INCOMPATIBLE_VERSION),
            (r#"{"name":"n","type":"t","ipam":{}}"#, ErrorCode::INCOMPATIBLE_VERSION),
            (r#"{"cniVersion":"1.0.0","name":"../x","type":"t","ipam":{}}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"mtu":10}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"mtu":"x"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#, ErrorCode::INVALID_CONFIG),
            (r#"{"cniVersion":"1.0.0","name":"n","type":"t","ipam":{},"ipMasq":true}"#, ErrorCode::UNSUPPORTED_FIELD),
        ];
        for (input, code) in cases {
            assert_eq!(parse(input).unwrap_err().code, code, "{input}");
        }
    }
}
