//! Spec versions this plugin speaks, which verbs each allows, and how a request names its version.
use serde_json::Value;

use super::{CniError, CniResult, ErrorCode, env::Command};

/// Every version VERSION reports and ADD/DEL accept, oldest first.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest version: used when the request names none we can answer in.
pub const LATEST: &str = "1.1.0";

pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Ordering of supported versions (`None` for one we do not speak).
fn rank(version: &str) -> Option<usize> {
    SUPPORTED.iter().position(|v| *v == version)
}

/// Results before 1.0.0 carry `ips[].version` ("4"/"6").
pub fn result_has_ip_version(version: &str) -> bool {
    version.starts_with("0.")
}

/// The version a configuration speaks: its `cniVersion`, or else the newest of its
/// `cniVersions` (libcni ≥ 1.2's negotiation list) that we support.
pub fn of_config(conf: &Value) -> Option<String> {
    if let Some(version) = conf.get("cniVersion").and_then(Value::as_str) {
        return Some(version.to_string());
    }
    let listed = conf.get("cniVersions")?.as_array()?;
    listed.iter().filter_map(Value::as_str).filter(|v| is_supported(v)).max_by_key(|v| rank(v)).map(str::to_string)
}

/// The version of a request on stdin if we speak it, else our latest: errors and VERSION
/// answer in it.
pub fn asked(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| of_config(&v))
        .filter(|v| is_supported(v))
        .unwrap_or_else(|| LATEST.to_string())
}

/// The oldest version in which `command` exists: CHECK came with 0.4.0, GC and STATUS with 1.1.0.
fn introduced(command: Command) -> &'static str {
    match command {
        Command::Check => "0.4.0",
        Command::Gc | Command::Status => "1.1.0",
        Command::Add | Command::Del | Command::Version => "0.3.0",
    }
}

/// Refuses a verb the configuration's version does not have (as the reference plugins do).
pub fn allows(command: Command, version: &str) -> CniResult<()> {
    let needed = introduced(command);
    if rank(version) >= rank(needed) {
        return Ok(());
    }
    Err(CniError::new(
        ErrorCode::INCOMPATIBLE_VERSION,
        format!(
            "{} needs cniVersion {needed} or later; the configuration says {version}",
            format!("{command:?}").to_uppercase()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn negotiates_from_cni_versions() {
        assert_eq!(of_config(&json!({"cniVersion": "0.4.0", "cniVersions": ["1.1.0"]})).unwrap(), "0.4.0");
        assert_eq!(of_config(&json!({"cniVersions": ["0.3.1", "1.0.0", "9.9.9"]})).unwrap(), "1.0.0");
        assert_eq!(of_config(&json!({"cniVersions": ["9.9.9"]})), None);
        assert_eq!(asked(br#"{"cniVersions": ["0.4.0"]}"#), "0.4.0");
    }

    #[test]
    fn verbs_by_version() {
        assert!(allows(Command::Check, "0.3.1").is_err());
        assert!(allows(Command::Check, "0.4.0").is_ok());
        assert!(allows(Command::Gc, "1.0.0").is_err());
        assert!(allows(Command::Status, "1.1.0").is_ok());
        for v in SUPPORTED {
            assert!(allows(Command::Add, v).is_ok() && allows(Command::Del, v).is_ok());
        }
    }
}
