//! The truth-table method of Kubernetes' own network-policy end-to-end tests: namespaces x, y
//! and z with pods a, b and c each, spread over two nodes, every pod serving TCP and UDP on 80
//! and 81. For each case a test writes NetworkPolicies (and labels, pods) into the fake API
//! server the nodes' agents watch, builds the matrix it expects by hand ([`Reachability`]),
//! probes every (from pod, to pod, port, protocol) in parallel and compares the whole matrix.
//! The expectations never come from the agent's own compiler: they are what the API means.
mod cluster;
mod expect;
mod model;
mod objects;
mod probe;
mod suite;
mod table;

pub use cluster::{NetpolCluster, Options, PROBE_TIMEOUT};
pub use expect::{Peer, Reachability};
pub use model::{ALL_TARGETS, Family, NAMESPACES, POD_NAMES, PodRef, Protocol, TCP_80, TCP_81, Target, UDP_80, UDP_81};
pub use objects::{XA, ip_block, labels, ns_peer, pod_peer, policy, port, port_range, xa_egress, xa_ingress};
pub use probe::{Probe, probe_once};
pub use suite::Tally;
