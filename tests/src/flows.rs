//! Flows of the Service suites, either family: who asks whom (a connected TCP or UDP socket,
//! so only an answer from the very address asked for counts, see `probe.rs`), and what source
//! the server must have seen. A suite runs them all and lists the failures at the end, so one
//! run shows the whole picture.
use std::net::{IpAddr, SocketAddr};

use crate::{kube_proxy::Protocol, probe};

/// What a flow's server must have seen as the source.
#[derive(Clone, Copy, Debug)]
pub enum Saw {
    Exactly(IpAddr),
    /// Any source: the path masquerades behind whichever node address faces the endpoint.
    Anything,
}

pub struct Flow {
    pub name: String,
    /// The client's network namespace.
    pub from: String,
    pub protocol: Protocol,
    pub to: SocketAddr,
    pub saw: Saw,
}

impl Flow {
    pub fn new(name: &str, from: &str, protocol: Protocol, to: impl Into<SocketAddr>, saw: Saw) -> Self {
        let kind = if protocol == Protocol::Tcp { "TCP" } else { "connected UDP" };
        Self { name: format!("{name} ({kind})"), from: from.to_string(), protocol, to: to.into(), saw }
    }

    pub fn check(&self) -> anyhow::Result<()> {
        let seen = match self.protocol {
            Protocol::Tcp => probe::ask_tcp(&self.from, self.to)?,
            Protocol::Udp => probe::ask_udp(&self.from, self.to)?,
        };
        match self.saw {
            Saw::Exactly(expected) if seen.ip() != expected => {
                anyhow::bail!("answered, but the server saw {seen} instead of {expected}")
            }
            _ => Ok(()),
        }
    }
}

/// Prints `name`'s outcome as one line prefixed with `label`; its failure, if any, goes into
/// `failures`.
pub fn report(label: &str, name: &str, outcome: anyhow::Result<()>, failures: &mut Vec<String>) {
    match outcome {
        Ok(()) => println!("{label} ok   {name}"),
        Err(e) => {
            println!("{label} FAIL {name}: {e:#}");
            failures.push(format!("{name}: {e:#}"));
        }
    }
}

/// Runs every flow in order (order matters: a flow may change the path of later ones) and
/// returns the failures.
pub fn run_all(label: &str, flows: &[Flow]) -> Vec<String> {
    let mut failures = Vec::new();
    for flow in flows {
        report(label, &flow.name, flow.check(), &mut failures);
    }
    failures
}
