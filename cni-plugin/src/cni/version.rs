//! Spec versions this plugin speaks, and what differs between their result formats.

/// Every version VERSION reports and ADD/DEL accept, oldest first.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest version: used when the request names none we can answer in.
pub const LATEST: &str = "1.1.0";

pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Results before 1.0.0 carry `ips[].version` ("4"/"6").
pub fn result_has_ip_version(version: &str) -> bool {
    version.starts_with("0.")
}

/// The `cniVersion` of a request on stdin if we speak it, else our latest: errors and VERSION
/// answer in it.
pub fn asked(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| is_supported(v))
        .unwrap_or_else(|| LATEST.to_string())
}
