//! What the compiler reads: the cluster's Namespaces, Pods and NetworkPolicies (as the API
//! gives them, pods reduced to what policy needs when they arrive), this node's addresses, and
//! the node's own pods as `ENDPOINTS` holds them.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::NetworkPolicy,
};
use serde::Deserialize;

use super::{ports, selector::Labels};

/// Namespace and name.
pub type ObjectKey = (String, String);

/// A container port with a name (named ports of `ports` entries resolve against these).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub protocol: u8,
    pub port: u16,
}

/// A pod as policy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    /// `status.podIPs`, in order (the primary first).
    pub ips: Vec<IpAddr>,
    pub ports: BTreeSet<NamedPort>,
}

/// A pod of this node in `ENDPOINTS`: its host veth and attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    pub ifindex: u32,
    pub owner: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Input {
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: BTreeMap<ObjectKey, PodInfo>,
    pub policies: BTreeMap<ObjectKey, NetworkPolicy>,
    /// This node's addresses: `IDENTITY_HOST`.
    pub node_addrs: BTreeSet<IpAddr>,
    /// The node's pods by address (`ENDPOINTS`, link-local entries left out).
    pub locals: BTreeMap<IpAddr, Local>,
}

/// `policy-set --input`: the API's own JSON of each object.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InputFile {
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
    #[serde(default)]
    pub pods: Vec<Pod>,
    #[serde(default)]
    pub network_policies: Vec<NetworkPolicy>,
    #[serde(default)]
    pub node_addresses: Vec<IpAddr>,
}

impl InputFile {
    pub fn into_input(self) -> Input {
        let mut input = Input::default();
        input.list_namespaces(self.namespaces);
        input.list_pods(self.pods);
        input.list_policies(self.network_policies);
        input.node_addrs = self.node_addresses.into_iter().collect();
        input
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

impl Input {
    pub fn list_namespaces(&mut self, all: Vec<Namespace>) {
        self.namespaces.clear();
        all.iter().for_each(|n| self.apply_namespace(n));
    }

    pub fn apply_namespace(&mut self, ns: &Namespace) {
        let name = ns.metadata.name.clone().unwrap_or_default();
        self.namespaces.insert(name, ns.metadata.labels.clone().unwrap_or_default());
    }

    pub fn delete_namespace(&mut self, ns: &Namespace) {
        self.namespaces.remove(ns.metadata.name.as_deref().unwrap_or_default());
    }

    pub fn list_pods(&mut self, all: Vec<Pod>) {
        self.pods.clear();
        all.iter().for_each(|p| self.apply_pod(p));
    }

    /// A pod without addresses, on the host network, or ended (its addresses may be another
    /// pod's by now) is no peer and no subject: left out.
    pub fn apply_pod(&mut self, pod: &Pod) {
        match pod_info(pod) {
            Some(info) => self.pods.insert(key(&pod.metadata), info),
            None => self.pods.remove(&key(&pod.metadata)),
        };
    }

    pub fn delete_pod(&mut self, pod: &Pod) {
        self.pods.remove(&key(&pod.metadata));
    }

    pub fn list_policies(&mut self, all: Vec<NetworkPolicy>) {
        self.policies = all.into_iter().map(|p| (key(&p.metadata), p)).collect();
    }

    pub fn apply_policy(&mut self, policy: &NetworkPolicy) {
        self.policies.insert(key(&policy.metadata), policy.clone());
    }

    pub fn delete_policy(&mut self, policy: &NetworkPolicy) {
        self.policies.remove(&key(&policy.metadata));
    }
}

/// What policy needs of `pod`; `None` when it has no address of its own to judge.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<IpAddr> = status.pod_ips.iter().flatten().filter_map(|p| p.ip.parse().ok()).collect();
    if ips.is_empty() {
        ips.extend(status.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok()));
    }
    if ips.is_empty() {
        return None;
    }
    let ports = spec
        .into_iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let name = p.name.clone()?;
            let protocol = ports::protocol(p.protocol.as_deref()).ok()?;
            let port = u16::try_from(p.container_port).ok()?;
            Some(NamedPort { name, protocol, port })
        })
        .collect();
    let (namespace, name) = key(&pod.metadata);
    Some(PodInfo { namespace, name, labels: pod.metadata.labels.clone().unwrap_or_default(), ips, ports })
}
