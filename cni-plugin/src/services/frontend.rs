//! What the datapath serves: a frontend (an address, port and protocol a client reaches a
//! Service at) and its entry (the backends, in order, and how to pick among them).
use std::{fmt, net::IpAddr};

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Tcp,
    Udp,
}

/// The datapath's lookup key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Frontend {
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (addr, port, protocol) = (self.addr, self.port, self.protocol);
        match addr {
            IpAddr::V4(_) => write!(f, "{addr}:{port}/{protocol:?}"),
            IpAddr::V6(_) => write!(f, "[{addr}]:{port}/{protocol:?}"),
        }
    }
}

/// Where the frontend comes from: traffic policies differ between the cluster's own address
/// (internal) and the others (external).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl Kind {
    pub fn external(self) -> bool {
        self != Kind::ClusterIp
    }
}

/// What a client meets when the entry has no backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WhenEmpty {
    /// The Service has no usable endpoint at all: refused at once (ICMP port unreachable, TCP
    /// RST), as kube-proxy's REJECT.
    Reject,
    /// It has endpoints, none on this node, and its traffic policy is Local: dropped.
    Drop,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub addr: IpAddr,
    pub port: u16,
    /// The endpoint's `nodeName` and `zone`, as the EndpointSlice gave them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Serving but terminating: chosen only because the Service has no ready endpoint.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub terminating: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// `namespace/name:port` (the port's name, else its number), for logs and inspect.
    pub service: String,
    pub kind: Kind,
    /// In address order: the same set always gives the same list, whatever order the API
    /// server sent it in.
    pub backends: Vec<Backend>,
    /// The traffic policy that applies here (external for [`Kind::external`] frontends,
    /// internal for the ClusterIP) is Local: only this node's endpoints are in `backends`, and
    /// for an external one the client's source address is kept.
    pub local_only: bool,
    /// External frontends with `externalTrafficPolicy: Local` only: what this node's own pods
    /// and processes reach there (every usable endpoint), as kube-proxy sends them rather than
    /// dropping them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal: Option<Vec<Backend>>,
    /// `sessionAffinity: ClientIP`: a client sticks to its backend for this many seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_seconds: Option<u32>,
    pub when_empty: WhenEmpty,
    /// Endpoints still listed that take no new connection (terminating, not ready, beyond the
    /// cut to the maximum): a change that drops one from `backends` leaves the connections
    /// open to it alone (no socket destroyed, no flow ended), so a pod draining in a rollout
    /// finishes them. Once it is gone from the slices, they are ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<Backend>,
}

/// What the agent tells the datapath, one frontend at a time, only for frontends whose entry
/// changed. `flush` ends a batch (one watch burst): a writer may apply its changes then.
pub trait ServiceSink {
    fn upsert(&mut self, frontend: &Frontend, entry: &Entry);
    fn remove(&mut self, frontend: &Frontend);
    fn flush(&mut self) {}
    /// Called when no change came for a while: a writer may check its target is still there.
    fn idle(&mut self) {}
}
