//! `CNI_*` environment variables, validated before anything touches the node: the container ID
//! and interface name become parts of file, pin and interface names, so nothing like `../` passes.
use std::{collections::BTreeMap, path::PathBuf};

use super::{CniError, CniResult, ErrorCode};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    fn parse(s: &str) -> CniResult<Self> {
        Ok(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            "VERSION" => Self::Version,
            other => return Err(invalid(format!("unknown CNI_COMMAND {other:?}"))),
        })
    }

    /// Verbs that act on one attachment and so need CNI_CONTAINERID and CNI_IFNAME.
    fn per_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }
}

/// The validated invocation environment.
#[derive(Debug)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    /// Empty when the runtime sent none (allowed for DEL: the netns may be gone).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub path: Vec<PathBuf>,
    /// `CNI_ARGS` as key → value (see [`super::request`] for the keys we act on).
    pub args: BTreeMap<String, String>,
}

impl CniEnv {
    /// Reads the variables through `get` (the process environment in production, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> CniResult<Self> {
        let command = Command::parse(&get("CNI_COMMAND").unwrap_or_default())?;
        let nonempty = |key: &str| get(key).filter(|v| !v.is_empty());
        let mut env = Self {
            command,
            container_id: String::new(),
            netns: nonempty("CNI_NETNS").map(PathBuf::from),
            ifname: String::new(),
            path: nonempty("CNI_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default(),
            args: parse_args(&get("CNI_ARGS").unwrap_or_default())?,
        };
        if command.per_attachment() {
            let id = nonempty("CNI_CONTAINERID").ok_or_else(|| invalid("CNI_CONTAINERID is required"))?;
            validate_container_id(&id)?;
            let ifname = nonempty("CNI_IFNAME").ok_or_else(|| invalid("CNI_IFNAME is required"))?;
            validate_ifname(&ifname)?;
            if env.path.is_empty() {
                return Err(invalid("CNI_PATH is required"));
            }
            env.container_id = id;
            env.ifname = ifname;
        }
        if matches!(command, Command::Add | Command::Check) && env.netns.is_none() {
            return Err(invalid("CNI_NETNS is required"));
        }
        Ok(env)
    }

    /// CNI_PATH, required by the verbs that may run another plugin (GC, STATUS delegating).
    pub fn require_path(&self) -> CniResult<()> {
        if self.path.is_empty() { Err(invalid("CNI_PATH is required")) } else { Ok(()) }
    }
}

pub(super) fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INVALID_ENV, msg)
}

/// Longest container ID (and network name) accepted: a network name becomes a directory name,
/// and no runtime's IDs come near it (64 hex digits in containerd, CRI-O and podman).
pub const MAX_ID_LEN: usize = 255;

/// The spec's container ID grammar, `[a-zA-Z0-9][a-zA-Z0-9_.-]*`, at most [`MAX_ID_LEN`] bytes.
pub fn validate_container_id(id: &str) -> CniResult<()> {
    if id.len() > MAX_ID_LEN {
        return Err(invalid(format!("CNI_CONTAINERID is {} bytes long, more than {MAX_ID_LEN}", id.len())));
    }
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(invalid(format!("CNI_CONTAINERID {id:?} has characters outside [a-zA-Z0-9_.-]")))
    }
}

/// The kernel's interface name rules: 1–15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> CniResult<()> {
    let bad_char = name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
    if name.is_empty() || name.len() > 15 || name == "." || name == ".." || bad_char {
        return Err(invalid(format!("CNI_IFNAME {name:?} is not a valid interface name")));
    }
    Ok(())
}

/// `K1=V1;K2=V2`. An item without `=` is malformed.
fn parse_args(raw: &str) -> CniResult<BTreeMap<String, String>> {
    raw.split(';')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(invalid(format!("CNI_ARGS item {item:?} is not KEY=VALUE"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> CniResult<CniEnv> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CniEnv::from_lookup(|k| map.get(k).cloned())
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc-1.2_3"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    fn with(overrides: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut pairs: Vec<_> = ADD.iter().copied().filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k)).collect();
        pairs.extend(overrides.iter().filter(|(_, v)| !v.is_empty()));
        pairs
    }

    #[test]
    fn valid_add() {
        let e = env(&ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn rejects_bad_values_with_code_4() {
        for bad in [
            ("CNI_COMMAND", "FROB"),
            ("CNI_CONTAINERID", "../etc"),
            ("CNI_CONTAINERID", "-lead"),
            ("CNI_CONTAINERID", "a/../../b"),
            ("CNI_CONTAINERID", "x".repeat(MAX_ID_LEN + 1).leak()),
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", "this-name-is-too-long"),
            ("CNI_IFNAME", "a/b"),
            ("CNI_IFNAME", ".."),
            ("CNI_NETNS", ""),
            ("CNI_PATH", ""),
            ("CNI_ARGS", "IP"),
        ] {
            let err = env(&with(&[bad])).unwrap_err();
            assert_eq!(err.code, ErrorCode::INVALID_ENV, "{bad:?}");
        }
    }

    #[test]
    fn del_without_netns_is_fine() {
        let e = env(&with(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")])).unwrap();
        assert!(e.netns.is_none());
    }

    #[test]
    fn runtime_args_are_accepted() {
        env(&with(&[("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web-0;IP=10.0.0.5")])).unwrap();
    }
}
