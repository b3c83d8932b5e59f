//! One Service's frontends and their entries, from its spec, its EndpointSlices and this node,
//! by kube-proxy's rules: endpoints by their conditions (ready; serving and terminating only
//! when none is ready), the traffic policies choosing this node's endpoints, one family per
//! frontend.
use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use super::{
    frontend::{Backend, Entry, Frontend, Kind, WhenEmpty},
    spec::{Endpoint, PortSpec, ServiceSpec, SliceSpec},
};

/// What of this node a translation depends on.
#[derive(Clone, Debug, Default)]
pub struct Node {
    pub name: String,
    /// Where NodePorts are served: the node's addresses (every family it has).
    pub addrs: Vec<IpAddr>,
}

pub struct Translation {
    pub frontends: BTreeMap<Frontend, Arc<Entry>>,
    /// Frontends whose backends were cut to `max_backends`.
    pub truncated: usize,
    /// Frontends the Service names twice (two ports alike): the first is kept.
    pub duplicates: usize,
    /// Frontend and endpoint addresses left out as no Service's to take ([`routable`]).
    pub unroutable: usize,
}

/// Whether `ip` may be a Service's frontend or backend. Not the node's own loopback, the
/// unspecified address, link-local (a cloud's metadata service, 169.254.169.254, among them),
/// multicast or broadcast: the socket LB sees every connect of the node's processes, and an
/// API object (an externalIP, a LoadBalancer IP in a status, an EndpointSlice) could otherwise
/// take `127.0.0.1:2379` or the metadata service for every host process.
pub fn routable(ip: IpAddr) -> bool {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || link_local)
}

pub fn translate<'a>(
    key: &str,
    spec: &ServiceSpec,
    slices: impl Iterator<Item = &'a SliceSpec> + Clone,
    node: &Node,
    max_backends: usize,
) -> Translation {
    let mut out = Translation { frontends: BTreeMap::new(), truncated: 0, duplicates: 0, unroutable: 0 };
    for port in &spec.ports {
        let mut endpoints = port_endpoints(port, slices.clone());
        let all = endpoints.len();
        endpoints.retain(|(e, _)| routable(e.addr));
        out.unroutable += all - endpoints.len();
        let service =
            if port.name.is_empty() { format!("{key}:{}", port.port) } else { format!("{key}:{}", port.name) };
        for v4 in [true, false] {
            if !spec.cluster_ips.iter().any(|ip| ip.is_ipv4() == v4) {
                continue;
            }
            let family: Vec<&(Endpoint, u16)> = endpoints.iter().filter(|(e, _)| e.addr.is_ipv4() == v4).collect();
            let sets = Sets::of(&family, &node.name);
            let mut add = |addr: IpAddr, port_number: u16, kind: Kind| {
                // An externalIP or LoadBalancer IP that is this node's own address would take
                // the node's sockets' traffic from the LAN (sshd, the kubelet): never.
                let node_own = matches!(kind, Kind::ExternalIp | Kind::LoadBalancer) && node.addrs.contains(&addr);
                if !routable(addr) || node_own {
                    out.unroutable += 1;
                    return;
                }
                let frontend = Frontend { addr, port: port_number, protocol: port.protocol };
                let (entry, cut) = sets.entry(service.clone(), kind, spec, max_backends);
                out.truncated += usize::from(cut);
                if out.frontends.insert(frontend, Arc::new(entry)).is_some() {
                    out.duplicates += 1;
                }
            };
            let of_family = |ip: &&IpAddr| ip.is_ipv4() == v4;
            for &ip in spec.cluster_ips.iter().filter(of_family) {
                add(ip, port.port, Kind::ClusterIp);
            }
            if let Some(node_port) = port.node_port {
                for &ip in node.addrs.iter().filter(of_family) {
                    add(ip, node_port, Kind::NodePort);
                }
            }
            for &ip in spec.external_ips.iter().filter(of_family) {
                add(ip, port.port, Kind::ExternalIp);
            }
            for &ip in spec.lb_ips.iter().filter(of_family) {
                add(ip, port.port, Kind::LoadBalancer);
            }
        }
    }
    out
}

/// Every endpoint of the Service for this port, with the port number its EndpointSlice gives
/// (matched by the port's name and protocol). One address and port is one endpoint, whichever
/// slices repeat it (during a rollover both may list it): a ready copy wins.
fn port_endpoints<'a>(port: &PortSpec, slices: impl Iterator<Item = &'a SliceSpec>) -> Vec<(Endpoint, u16)> {
    let mut found: BTreeMap<(IpAddr, u16), Endpoint> = BTreeMap::new();
    for slice in slices {
        let number = slice.ports.iter().find(|(name, _, protocol)| *name == port.name && *protocol == port.protocol);
        let Some(&(_, number, _)) = number else { continue };
        for endpoint in &slice.endpoints {
            let at = (endpoint.addr, number);
            if found.get(&at).is_none_or(|old| !old.ready && endpoint.ready) {
                found.insert(at, endpoint.clone());
            }
        }
    }
    found.into_iter().map(|((_, number), endpoint)| (endpoint, number)).collect()
}

/// The usable endpoints of one port and family: all of them, and this node's; and every
/// endpoint listed at all, usable or not.
struct Sets {
    cluster: Vec<Backend>,
    local: Vec<Backend>,
    listed: Vec<Backend>,
}

impl Sets {
    fn of(endpoints: &[&(Endpoint, u16)], own: &str) -> Self {
        let usable = |local: bool| {
            let pick = |ready: bool| -> Vec<Backend> {
                endpoints
                    .iter()
                    .filter(|(e, _)| !local || e.node.as_deref() == Some(own))
                    .filter(|(e, _)| if ready { e.ready } else { e.serving && e.terminating })
                    .map(|(e, port)| backend(e, *port))
                    .collect()
            };
            let ready = pick(true);
            // Terminating endpoints still serving carry a Service through a rollout's end,
            // but only while nothing ready is left (kube-proxy's rule, for each set).
            if ready.is_empty() { pick(false) } else { ready }
        };
        let listed = endpoints.iter().map(|(e, port)| backend(e, *port)).collect();
        Self { cluster: usable(false), local: usable(true), listed }
    }

    /// The entry of a frontend of `kind`; whether its backends were cut to `max`.
    fn entry(&self, service: String, kind: Kind, spec: &ServiceSpec, max: usize) -> (Entry, bool) {
        let local_only = if kind.external() { spec.external_local } else { spec.internal_local };
        let mut backends = if local_only { self.local.clone() } else { self.cluster.clone() };
        let cut = backends.len() > max;
        backends.truncate(max);
        let internal = (local_only && kind.external()).then(|| self.cluster.iter().take(max).cloned().collect());
        let when_empty =
            if backends.is_empty() && !self.cluster.is_empty() { WhenEmpty::Drop } else { WhenEmpty::Reject };
        let affinity_seconds = spec.affinity_seconds;
        // Listed but taking no new connection (terminating, not ready, beyond the cut): the
        // connections already open to them are left to finish, as kube-proxy leaves TCP.
        let draining = self.listed.iter().filter(|b| !backends.contains(b)).cloned().collect();
        let entry = Entry { service, kind, backends, local_only, internal, affinity_seconds, when_empty, draining };
        (entry, cut)
    }
}

fn backend(endpoint: &Endpoint, port: u16) -> Backend {
    Backend {
        addr: endpoint.addr,
        port,
        node: endpoint.node.clone(),
        zone: endpoint.zone.clone(),
        terminating: endpoint.terminating,
    }
}
