//! The CNI error result: `{cniVersion, code, msg, details}` on stdout and a non-zero exit.
use std::fmt;

use serde::Serialize;

/// Error codes of the CNI spec (1–99 are the spec's own), then ours (100+). A newtype rather
/// than an enum so that a delegated IPAM plugin's own code passes through unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    pub const INCOMPATIBLE_VERSION: Self = Self(1);
    #[allow(dead_code, reason = "the spec's code 2; nothing we accept is unsupported today")]
    pub const UNSUPPORTED_FIELD: Self = Self(2);
    /// The container (its netns) does not exist; the runtime need not call DEL.
    pub const UNKNOWN_CONTAINER: Self = Self(3);
    pub const INVALID_ENV: Self = Self(4);
    pub const IO: Self = Self(5);
    pub const DECODE: Self = Self(6);
    pub const INVALID_CONFIG: Self = Self(7);
    /// Transient: another call holds what this one needs; the runtime should retry.
    pub const TRY_AGAIN_LATER: Self = Self(11);
    /// STATUS: the plugin cannot serve ADD right now (the reason is in `msg`).
    pub const NOT_AVAILABLE: Self = Self(50);
    /// Plugin-specific: no free address left in a range set.
    pub const POOL_EXHAUSTED: Self = Self(100);
    /// Plugin-specific: the pod already has this interface (or its host end exists).
    pub const INTERFACE_EXISTS: Self = Self(101);
    /// Plugin-specific: bpffs or BTF is missing, or the kernel refused the programs.
    pub const DATAPATH: Self = Self(102);
    /// Plugin-specific: an address the runtime asked for (an IP, or a MAC) is another
    /// attachment's.
    pub const ADDRESS_TAKEN: Self = Self(103);
    /// Plugin-specific: CHECK found the attachment differs from what ADD set up.
    pub const CHECK_FAILED: Self = Self(104);
    /// Plugin-specific: a datapath map has no room for the pod (`ENDPOINTS` at its size).
    pub const DATAPATH_FULL: Self = Self(105);
    pub const INTERNAL: Self = Self(999);
}

#[derive(Debug, Serialize)]
pub struct CniError {
    #[serde(skip)]
    pub code: ErrorCode,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: String::new() }
    }

    pub fn with_details(mut self, details: impl fmt::Display) -> Self {
        self.details = details.to_string();
        self
    }

    /// The JSON the runtime reads on stdout.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code.0,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code.0)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

pub type CniResult<T> = Result<T, CniError>;

/// Attaches a CNI code and message to any error, keeping its chain as `details`.
pub trait Context<T> {
    fn cni(self, code: ErrorCode, msg: impl Into<String>) -> CniResult<T>;
}

impl<T, E: Into<anyhow::Error>> Context<T> for Result<T, E> {
    fn cni(self, code: ErrorCode, msg: impl Into<String>) -> CniResult<T> {
        self.map_err(|e| CniError::new(code, msg).with_details(format!("{:#}", e.into())))
    }
}
