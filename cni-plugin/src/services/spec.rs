//! The Kubernetes objects read into what the model needs of them, once per change: a Service's
//! frontends' ingredients and an EndpointSlice's endpoints. Whatever cannot be served is left out
//! here with a log line and a count, so that the rest of the object still is.
use std::{net::IpAddr, time::Duration};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{frontend::Protocol, stats::Stats};

/// `namespace/name` of a Service (an EndpointSlice's through its `kubernetes.io/service-name`).
pub type Key = String;

/// The label that hands a Service to another proxy: kube-proxy leaves those alone, so do we.
const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label linking an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The API server refuses larger EndpointSlices: a bigger one did not come from it.
pub const MAX_SLICE_ENDPOINTS: usize = 1000;
/// `sessionAffinityConfig.clientIP.timeoutSeconds`' default (3 hours).
const DEFAULT_AFFINITY: Duration = Duration::from_secs(10800);

#[derive(Debug, PartialEq)]
pub struct ServiceSpec {
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<PortSpec>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` (type LoadBalancer only; not those in `ipMode: Proxy`,
    /// which a load balancer proxies to the nodes itself).
    pub lb_ips: Vec<IpAddr>,
    pub external_local: bool,
    pub internal_local: bool,
    pub affinity_seconds: Option<u32>,
}

#[derive(Debug, PartialEq)]
pub struct PortSpec {
    /// Matches the EndpointSlice port of the same name (the EndpointSlice controller resolves
    /// `targetPort`, by number or by a pod's named port, into that port's number).
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    pub node_port: Option<u16>,
}

/// What became of a Service.
#[derive(Debug, PartialEq)]
pub enum Read {
    Serve(ServiceSpec),
    /// Not ours to serve, or unusable (counted and logged already): nothing is served for it.
    Skip,
}

pub fn key(namespace: Option<&str>, name: Option<&str>) -> Key {
    format!("{}/{}", namespace.unwrap_or("default"), name.unwrap_or_default())
}

pub fn service_key(service: &Service) -> Key {
    key(service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
}

pub fn read_service(service: &Service, stats: &mut Stats) -> Read {
    let key = service_key(service);
    let spec = service.spec.clone().unwrap_or_default();
    let labels = service.metadata.labels.as_ref();
    let mut skip = |why: &str| {
        log::debug!("service {key}: {why}: not served");
        stats.services_skipped += 1;
        Read::Skip
    };
    if labels.is_some_and(|l| l.contains_key(PROXY_NAME_LABEL)) {
        return skip("another proxy's");
    }
    if spec.type_.as_deref() == Some("ExternalName") {
        return skip("an ExternalName");
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return skip("headless");
    }
    // `clusterIPs` lists every family's (the first is `clusterIP`); older objects only have
    // `clusterIP`.
    let texts = spec.cluster_ips.clone().filter(|c| !c.is_empty()).or_else(|| spec.cluster_ip.clone().map(|c| vec![c]));
    let cluster_ips = addresses(&key, "clusterIP", texts.iter().flatten(), stats);
    if cluster_ips.is_empty() {
        log::warn!("service {key}: no usable clusterIP: not served");
        stats.bad_services += 1;
        return Read::Skip;
    }
    let families: Vec<bool> = cluster_ips.iter().map(IpAddr::is_ipv4).collect();
    // Another family's address than the Service's (a single-stack IPv4 Service given an IPv6
    // external IP) has no backends to go to: kube-proxy of that family does not see the Service.
    let of_service_families = |ip: &IpAddr| families.contains(&ip.is_ipv4());
    let ports = read_ports(&key, spec.ports.as_deref().unwrap_or_default(), stats);
    if ports.is_empty() {
        log::warn!("service {key}: no port it can serve: not served");
        stats.bad_services += 1;
        return Read::Skip;
    }
    let mut external_ips = addresses(&key, "externalIP", spec.external_ips.iter().flatten(), stats);
    external_ips.retain(of_service_families);
    let mut lb_ips = Vec::new();
    if spec.type_.as_deref() == Some("LoadBalancer") {
        let status = service.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        let ingress = status.and_then(|lb| lb.ingress.as_ref()).into_iter().flatten();
        let ips = ingress.filter(|i| i.ip_mode.as_deref() != Some("Proxy")).filter_map(|i| i.ip.as_ref());
        lb_ips = addresses(&key, "load balancer IP", ips, stats);
        lb_ips.retain(of_service_families);
    }
    let affinity_seconds = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        let config = spec.session_affinity_config.as_ref().and_then(|c| c.client_ip.as_ref());
        let seconds = config.and_then(|c| c.timeout_seconds).and_then(|s| u32::try_from(s).ok());
        seconds.filter(|s| *s > 0).unwrap_or(DEFAULT_AFFINITY.as_secs() as u32)
    });
    Read::Serve(ServiceSpec {
        cluster_ips,
        ports,
        external_ips,
        lb_ips,
        external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        affinity_seconds,
    })
}

fn read_ports(key: &str, ports: &[k8s_openapi::api::core::v1::ServicePort], stats: &mut Stats) -> Vec<PortSpec> {
    let mut read = Vec::new();
    for port in ports {
        let name = port.name.clone().unwrap_or_default();
        let protocol = match protocol(port.protocol.as_deref()) {
            Ok(protocol) => protocol,
            Err(other) => {
                log::info!("service {key}: port {name:?} ({}/{other}): only TCP and UDP are served", port.port);
                stats.ports_skipped += 1;
                continue;
            }
        };
        let Some(number) = u16::try_from(port.port).ok().filter(|p| *p != 0) else {
            log::warn!("service {key}: port {name:?}: {} is no port number", port.port);
            stats.ports_skipped += 1;
            continue;
        };
        let node_port = port.node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0);
        read.push(PortSpec { name, port: number, protocol, node_port });
    }
    read
}

/// TCP when unset, as the API's default.
pub fn protocol(text: Option<&str>) -> Result<Protocol, String> {
    match text.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        other => Err(other.to_string()),
    }
}

fn addresses<'a>(key: &str, what: &str, texts: impl Iterator<Item = &'a String>, stats: &mut Stats) -> Vec<IpAddr> {
    let mut read = Vec::new();
    for text in texts {
        match text.parse::<IpAddr>() {
            Ok(ip) if !read.contains(&ip) => read.push(ip),
            Ok(_) => {}
            Err(_) => {
                log::warn!("service {key}: {what} {text:?} is not an IP address");
                stats.bad_addresses += 1;
            }
        }
    }
    read
}

#[derive(Debug, PartialEq)]
pub struct SliceSpec {
    pub service: Key,
    /// Name, port number, protocol.
    pub ports: Vec<(String, u16, Protocol)>,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node: Option<String>,
    pub zone: Option<String>,
}

/// `namespace/name` of the EndpointSlice itself.
pub fn slice_key(slice: &EndpointSlice) -> Key {
    key(slice.metadata.namespace.as_deref(), slice.metadata.name.as_deref())
}

/// `None`: nothing of it can be used (counted and logged).
pub fn read_slice(slice: &EndpointSlice, stats: &mut Stats) -> Option<SliceSpec> {
    let name = slice_key(slice);
    let labels = slice.metadata.labels.as_ref();
    let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
        log::warn!("endpointslice {name}: no {SERVICE_NAME_LABEL} label: ignored");
        stats.orphan_slices += 1;
        return None;
    };
    let service = key(slice.metadata.namespace.as_deref(), Some(service));
    // FQDN slices name hosts, not addresses: nothing the datapath can send to.
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Some(SliceSpec { service, ports: Vec::new(), endpoints: Vec::new() });
    }
    if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
        log::warn!(
            "endpointslice {name}: {} endpoints, more than the API allows ({MAX_SLICE_ENDPOINTS}): ignored",
            slice.endpoints.len()
        );
        stats.oversized_slices += 1;
        return Some(SliceSpec { service, ports: Vec::new(), endpoints: Vec::new() });
    }
    let mut ports = Vec::new();
    for port in slice.ports.iter().flatten() {
        let number = port.port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0);
        if let (Some(number), Ok(protocol)) = (number, protocol(port.protocol.as_deref())) {
            ports.push((port.name.clone().unwrap_or_default(), number, protocol));
        }
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for endpoint in &slice.endpoints {
        // kube-proxy uses an endpoint's first address only (the API allows one).
        let Some(text) = endpoint.addresses.first() else { continue };
        let Ok(addr) = text.parse::<IpAddr>() else {
            log::warn!("endpointslice {name}: endpoint address {text:?} is not an IP address");
            stats.bad_addresses += 1;
            continue;
        };
        let conditions = endpoint.conditions.clone().unwrap_or_default();
        // Unset means ready (the API's rule); unset serving means as ready.
        let ready = conditions.ready.unwrap_or(true);
        endpoints.push(Endpoint {
            addr,
            ready,
            serving: conditions.serving.unwrap_or(ready),
            terminating: conditions.terminating.unwrap_or(false),
            node: endpoint.node_name.clone(),
            zone: endpoint.zone.clone(),
        });
    }
    Some(SliceSpec { service, ports, endpoints })
}
