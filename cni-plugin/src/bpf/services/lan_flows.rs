//! Flows from the LAN (`SVC_CT`, translated per packet) to a backend that is gone. Left alone,
//! the client's packets would go on to the dead backend's address and the connection hang until
//! its own timeouts. Their entries, both ways, are deleted instead: the client's next packet
//! then finds no flow and goes to the node's stack, which has no socket on the frontend's port
//! and answers a TCP segment with a RST; a UDP datagram opens a new flow to a live backend.
use std::net::SocketAddr;

use aya::maps::{HashMap, MapData};
use ebpf_common::{FlowKey, SVC_CT_FORWARD, SvcCtEntry};

use super::{Maps, backend_value, service_key, settle::Job};

pub(super) type Flows = HashMap<MapData, FlowKey, SvcCtEntry>;

/// Deletes the flows of every job's frontend (external ones: the caller filters) whose backend
/// the job removed; how many flows.
pub(super) fn end(maps: &mut Maps, jobs: &[Job]) -> usize {
    if jobs.is_empty() {
        return 0;
    }
    let nodes = &maps.node_addrs;
    // Collected first: deleting while walking the hash would skip entries. At most two visits
    // a slot: a walk of an LRU restarts when its key is evicted, which a flood could repeat.
    let budget = 2 * maps.flows_capacity as usize;
    let doomed: Vec<(FlowKey, FlowKey)> = maps
        .flows
        .iter()
        .take(budget)
        .filter_map(Result::ok)
        .filter(|(key, entry)| entry.direction == SVC_CT_FORWARD && jobs.iter().any(|j| ends(j, nodes, key, entry)))
        .map(|(key, entry)| (key, reply_key(&key, &entry)))
        .collect();
    for (forward, reply) in &doomed {
        let _ = maps.flows.remove(forward);
        let _ = maps.flows.remove(reply);
    }
    doomed.len()
}

/// Whether the forward entry `key` → `entry` is a flow to `job`'s frontend and one of its
/// removed backends. A NodePort (address unspecified) is reached on the node's addresses
/// (`nodes`) only: a LoadBalancer IP or externalIP on the same port is another Service's.
fn ends(job: &Job, nodes: &[[u8; 16]], key: &FlowKey, entry: &SvcCtEntry) -> bool {
    let frontend = service_key(job.frontend);
    let addressed =
        if frontend.addr == [0; 16] { nodes.contains(&key.dst_addr) } else { key.dst_addr == frontend.addr };
    addressed
        && key.family == frontend.family
        && key.protocol == frontend.protocol
        && key.dst_port == frontend.port
        && job.removed.iter().any(|b| is_backend(entry, *b))
}

fn is_backend(entry: &SvcCtEntry, backend: SocketAddr) -> bool {
    let b = backend_value(backend);
    entry.dst_addr == b.addr && entry.dst_port == b.port
}

/// The reply entry's key: the backend's packets to what the client's became.
fn reply_key(key: &FlowKey, entry: &SvcCtEntry) -> FlowKey {
    FlowKey {
        family: key.family,
        protocol: key.protocol,
        pad: [0; 2],
        src_port: entry.dst_port,
        dst_port: entry.src_port,
        src_addr: entry.dst_addr,
        dst_addr: entry.src_addr,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::bpf::services::{Frontend, Protocol};

    fn job(frontend: &str, removed: &[&str]) -> Job {
        let frontend: SocketAddr = frontend.parse().unwrap();
        Job {
            frontend: Frontend { ip: frontend.ip(), port: frontend.port(), protocol: Protocol::Tcp },
            removed: removed.iter().map(|b| b.parse().unwrap()).collect::<BTreeSet<_>>(),
            reconnect: true,
            external: true,
        }
    }

    fn flow(client: &str, to: &str, backend: &str) -> (FlowKey, SvcCtEntry) {
        let (client, to, backend): (SocketAddr, SocketAddr, SocketAddr) =
            (client.parse().unwrap(), to.parse().unwrap(), backend.parse().unwrap());
        let (c, t, b) = (backend_value(client), backend_value(to), backend_value(backend));
        let key = FlowKey {
            family: 4,
            protocol: 6,
            pad: [0; 2],
            src_port: c.port,
            dst_port: t.port,
            src_addr: c.addr,
            dst_addr: t.addr,
        };
        let entry = SvcCtEntry {
            src_addr: c.addr,
            dst_addr: b.addr,
            src_port: c.port,
            dst_port: b.port,
            direction: SVC_CT_FORWARD,
            state: 2,
            pad: [0; 2],
            last_seen_ns: 0,
        };
        (key, entry)
    }

    /// Node 1's address in the maps' form.
    fn node() -> Vec<[u8; 16]> {
        vec![backend_value("192.0.2.11:0".parse().unwrap()).addr]
    }

    #[test]
    fn only_flows_of_the_frontend_to_a_removed_backend_end() {
        let nodes = node();
        let ends = |job: &Job, key: &FlowKey, entry: &SvcCtEntry| ends(job, &nodes, key, entry);
        let node_port = job("0.0.0.0:30080", &["10.1.0.5:8080"]);
        let (key, entry) = flow("192.0.2.100:40000", "192.0.2.11:30080", "10.1.0.5:8080");
        assert!(ends(&node_port, &key, &entry), "a NodePort flow on the node's address");
        let (key, other) = flow("192.0.2.100:40000", "192.0.2.11:30080", "10.1.0.6:8080");
        assert!(!ends(&node_port, &key, &other), "a backend that stays");
        let (key, entry) = flow("192.0.2.100:40000", "192.0.2.11:30081", "10.1.0.5:8080");
        assert!(!ends(&node_port, &key, &entry), "another port's flow");
        let lb = job("203.0.113.7:80", &["10.1.0.5:8080"]);
        let (key, entry) = flow("192.0.2.100:40000", "203.0.113.8:80", "10.1.0.5:8080");
        assert!(!ends(&lb, &key, &entry), "another LoadBalancer IP");
        // An attack review's: a NodePort on port 80 whose author removes a backend must not
        // end another Service's LoadBalancer IP flows on port 80 to the same pod.
        let on_80 = job("0.0.0.0:80", &["10.1.0.5:8080"]);
        let (key, entry) = flow("192.0.2.100:40000", "203.0.113.7:80", "10.1.0.5:8080");
        assert!(!ends(&on_80, &key, &entry), "a LoadBalancer IP's flow on the NodePort's port");
    }

    #[test]
    fn the_reply_key_is_the_backend_to_the_client_as_translated() {
        let (key, mut entry) = flow("192.0.2.100:40000", "192.0.2.11:30080", "10.2.0.5:8080");
        // SNATed to the node's address and port 61234 for a backend on another node.
        entry.src_addr = backend_value("192.0.2.11:61234".parse().unwrap()).addr;
        entry.src_port = 61234;
        let reply = reply_key(&key, &entry);
        assert_eq!((reply.src_port, reply.dst_port), (8080, 61234));
        assert_eq!((reply.src_addr, reply.dst_addr), (entry.dst_addr, entry.src_addr));
    }
}
