//! Address management: the built-in host-local-compatible allocator, or any other IPAM plugin
//! executed from CNI_PATH as the spec describes.
mod delegate;
mod host_local;
mod range;
mod record;
mod spares;
mod store;

use std::net::IpAddr;

use serde_json::Value;
pub use store::Holder;

use crate::cni::{
    CniError, CniResult, ErrorCode,
    config::NetConf,
    env::CniEnv,
    result::{IpConfig, Route},
};

/// `ipam.type` values served in-process.
const BUILT_IN: [&str; 2] = ["host-local", "ebpf-cni"];

/// What IPAM handed out for one attachment.
#[derive(Debug, Default)]
pub struct Allocation {
    pub ips: Vec<IpConfig>,
    /// Routes for the pod; a route without `gw` goes via the address's gateway.
    pub routes: Vec<Route>,
    pub dns: Value,
}

/// Whether `ipam.type` is served in-process (its `dataDir` is then ours to write).
pub fn is_built_in(kind: &str) -> bool {
    BUILT_IN.contains(&kind)
}

pub enum Ipam {
    HostLocal(host_local::HostLocal),
    Delegated(delegate::Delegated),
}

impl Ipam {
    pub fn from_conf(conf: &NetConf, raw_conf: &[u8]) -> CniResult<Self> {
        let ipam = conf.ipam.as_ref().ok_or_else(|| CniError::new(ErrorCode::INVALID_CONFIG, "ipam is required"))?;
        let kind = ipam.get("type").and_then(Value::as_str).unwrap_or_default();
        if is_built_in(kind) {
            Ok(Self::HostLocal(host_local::HostLocal::from_conf(&conf.name, ipam)?))
        } else if kind.is_empty() {
            Err(CniError::new(ErrorCode::INVALID_CONFIG, "ipam.type is required"))
        } else {
            Ok(Self::Delegated(delegate::Delegated::new(kind, raw_conf)?))
        }
    }

    pub fn allocate(&self, env: &CniEnv, requested: &[IpAddr]) -> CniResult<Allocation> {
        match self {
            Self::HostLocal(h) => h.allocate(&env.container_id, &env.ifname, requested),
            // The delegate reads the same CNI_ARGS and runtimeConfig itself.
            Self::Delegated(d) => d.add(env),
        }
    }

    /// Releases the attachment's addresses; idempotent.
    pub fn release(&self, env: &CniEnv) -> CniResult<()> {
        match self {
            Self::HostLocal(h) => h.release(&env.container_id, &env.ifname),
            Self::Delegated(d) => d.del(env),
        }
    }

    /// Removes the spare files the built-in allocator keeps (`spares.rs`): the network's last
    /// attachment is gone.
    pub fn drop_spares(&self) -> CniResult<()> {
        match self {
            Self::HostLocal(h) => h.drop_spares(),
            Self::Delegated(_) => Ok(()),
        }
    }

    /// The addresses the attachment was given, as the built-in allocator recorded them; None
    /// when unknown (a delegate, an earlier build's ADD): then only a walk finds them.
    pub fn recorded(&self, env: &CniEnv) -> CniResult<Option<Vec<IpAddr>>> {
        match self {
            Self::HostLocal(h) => h.recorded(&env.container_id, &env.ifname),
            Self::Delegated(_) => Ok(None),
        }
    }

    /// The built-in allocator's range sets, each as its ranges' subnets; None for a delegate,
    /// whose ranges are its own configuration's.
    pub fn range_subnets(&self) -> Option<Vec<Vec<ipnetwork::IpNetwork>>> {
        match self {
            Self::HostLocal(h) => Some(h.subnets()),
            Self::Delegated(_) => None,
        }
    }

    /// Every holder of a reservation (none known for a delegate).
    pub fn holders(&self) -> CniResult<Vec<Holder>> {
        match self {
            Self::HostLocal(h) => h.holders(),
            Self::Delegated(_) => Ok(Vec::new()),
        }
    }

    /// CHECK: the attachment still holds `ips`.
    pub fn check(&self, env: &CniEnv, ips: &[IpAddr]) -> CniResult<()> {
        match self {
            Self::HostLocal(h) => h.check(&env.container_id, &env.ifname, ips),
            Self::Delegated(d) => d.forward(env, "CHECK"),
        }
    }

    /// GC: releases the reservations of attachments `keep` rejects and returns those it knows
    /// of (a delegate gets the same GC request and answers for itself).
    pub fn collect_garbage(&self, env: &CniEnv, keep: impl Fn(&Holder) -> bool) -> CniResult<Vec<Holder>> {
        match self {
            Self::HostLocal(h) => h.collect_garbage(keep),
            Self::Delegated(d) => {
                env.require_path()?;
                if d.speaks(env, "1.1.0")? {
                    d.forward(env, "GC")?;
                }
                Ok(Vec::new())
            }
        }
    }

    /// STATUS: whether an ADD could get an address now.
    pub fn status(&self, env: &CniEnv) -> CniResult<()> {
        match self {
            Self::HostLocal(h) => h.status(),
            Self::Delegated(d) => {
                env.require_path()?;
                if d.speaks(env, "1.1.0")? { d.forward(env, "STATUS") } else { Ok(()) }
            }
        }
    }
}
