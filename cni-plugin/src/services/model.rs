//! The Services the datapath must serve, kept from the API's Services and EndpointSlices and
//! handed on as differences: a change marks its Service, and [`Model::flush`] translates only
//! the marked Services again and tells the sink only the frontends whose entries changed. One
//! EndpointSlice event costs its own Service's translation, whatever the cluster's size.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{
    frontend::{Entry, Frontend, Kind, ServiceSink},
    spec::{self, Key, Read, SliceSpec},
    stats::Stats,
    translate::{Node, Translation, translate},
};

/// Backends one frontend may have: the socket LB's per-Service room (`SERVICE_MAX_BACKENDS`;
/// the writer refuses more), and a Service that big is cut (logged and counted) rather than
/// refused whole or starving the others.
pub const DEFAULT_MAX_BACKENDS: usize = ebpf_common::SERVICE_MAX_BACKENDS as usize;

pub struct Model {
    node: Node,
    max_backends: usize,
    services: HashMap<Key, Read>,
    /// Service → its EndpointSlices by their own `namespace/name`.
    slices: HashMap<Key, BTreeMap<Key, SliceSpec>>,
    /// EndpointSlice → the Service it was filed under (its label may change).
    slice_owner: HashMap<Key, Key>,
    /// Each Service's frontends as last translated.
    translations: HashMap<Key, BTreeMap<Frontend, Arc<Entry>>>,
    /// Every Service wanting a frontend, first come first: the first one serves it; a later one
    /// (duplicate ClusterIPs, external IPs) waits, and takes over when the first lets go.
    claims: HashMap<Frontend, Vec<Key>>,
    /// What the sink was told.
    served: HashMap<Frontend, Arc<Entry>>,
    dirty: HashSet<Key>,
    /// Both lists came: EndpointSlices naming unknown Services are counted from then on.
    services_listed: bool,
    pub stats: Stats,
}

impl Model {
    pub fn new(node: Node, max_backends: usize) -> Self {
        Self {
            node,
            max_backends,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_owner: HashMap::new(),
            translations: HashMap::new(),
            claims: HashMap::new(),
            served: HashMap::new(),
            dirty: HashSet::new(),
            services_listed: false,
            stats: Stats::default(),
        }
    }

    /// A complete list: Services not in it are gone.
    pub fn list_services(&mut self, list: Vec<Service>) {
        let listed: HashSet<Key> = list.iter().map(spec::service_key).collect();
        let gone: Vec<Key> = self.services.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for key in gone {
            self.services.remove(&key);
            self.dirty.insert(key);
        }
        for service in list {
            self.apply_service(&service);
        }
        self.services_listed = true;
    }

    pub fn apply_service(&mut self, service: &Service) {
        let key = spec::service_key(service);
        let read = spec::read_service(service, &mut self.stats);
        // A status update (or a label nobody reads) changes nothing served.
        if self.services.get(&key) != Some(&read) {
            self.services.insert(key.clone(), read);
            self.dirty.insert(key);
        }
    }

    pub fn delete_service(&mut self, service: &Service) {
        let key = spec::service_key(service);
        if self.services.remove(&key).is_some() {
            self.dirty.insert(key);
        }
    }

    /// A complete list: EndpointSlices not in it are gone.
    pub fn list_slices(&mut self, list: Vec<EndpointSlice>) {
        let listed: HashSet<Key> = list.iter().map(spec::slice_key).collect();
        let gone: Vec<Key> = self.slice_owner.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for name in gone {
            self.forget_slice(&name);
        }
        for slice in list {
            self.apply_slice(&slice);
        }
    }

    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let name = spec::slice_key(slice);
        let Some(read) = spec::read_slice(slice, &mut self.stats) else {
            self.forget_slice(&name);
            return;
        };
        if self.services_listed && !self.services.contains_key(&read.service) {
            log::warn!("endpointslice {name}: its service {} is not known (yet)", read.service);
            self.stats.orphan_slices += 1;
        }
        if self.slice_owner.get(&name).is_some_and(|owner| *owner != read.service) {
            self.forget_slice(&name);
        }
        let service = read.service.clone();
        let slices = self.slices.entry(service.clone()).or_default();
        if slices.get(&name) != Some(&read) {
            slices.insert(name.clone(), read);
            self.slice_owner.insert(name, service.clone());
            self.dirty.insert(service);
        }
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        self.forget_slice(&spec::slice_key(slice));
    }

    fn forget_slice(&mut self, name: &str) {
        let Some(service) = self.slice_owner.remove(name) else { return };
        if let Some(slices) = self.slices.get_mut(&service) {
            slices.remove(name);
            if slices.is_empty() {
                self.slices.remove(&service);
            }
        }
        self.dirty.insert(service);
    }

    /// This node's addresses (NodePorts are served there) changed.
    pub fn set_node_addrs(&mut self, mut addrs: Vec<IpAddr>) {
        addrs.sort();
        addrs.dedup();
        if addrs == self.node.addrs {
            return;
        }
        self.node.addrs = addrs;
        let with_node_ports =
            |read: &Read| matches!(read, Read::Serve(s) if s.ports.iter().any(|p| p.node_port.is_some()));
        self.dirty.extend(self.services.iter().filter(|(_, r)| with_node_ports(r)).map(|(k, _)| k.clone()));
    }

    /// Translates the Services changed since the last flush and tells `sink` of every frontend
    /// whose entry changed (and only those); returns them.
    pub fn flush(&mut self, sink: &mut dyn ServiceSink) -> BTreeSet<Frontend> {
        let mut touched = BTreeSet::new();
        for key in std::mem::take(&mut self.dirty) {
            self.retranslate(&key, &mut touched);
        }
        let mut changed = BTreeSet::new();
        for frontend in touched {
            let owner = self.claims.get(&frontend).and_then(|c| c.first());
            let wanted = owner.and_then(|k| self.translations.get(k)).and_then(|t| t.get(&frontend));
            match (wanted, self.served.get(&frontend)) {
                (Some(want), Some(have)) if want == have => continue,
                (Some(want), _) => {
                    sink.upsert(&frontend, want);
                    self.served.insert(frontend, Arc::clone(want));
                }
                (None, Some(_)) => {
                    sink.remove(&frontend);
                    self.served.remove(&frontend);
                }
                (None, None) => continue,
            }
            changed.insert(frontend);
        }
        if !changed.is_empty() {
            sink.flush();
        }
        changed
    }

    fn retranslate(&mut self, key: &Key, touched: &mut BTreeSet<Frontend>) {
        let new = match self.services.get(key) {
            Some(Read::Serve(spec)) => {
                let slices = self.slices.get(key).into_iter().flat_map(|s| s.values());
                let translation = translate(key, spec, slices, &self.node, self.max_backends);
                self.count(key, &translation);
                translation.frontends
            }
            _ => BTreeMap::new(),
        };
        let old = self.translations.remove(key).unwrap_or_default();
        for frontend in old.keys().filter(|f| !new.contains_key(*f)) {
            if let Some(claims) = self.claims.get_mut(frontend) {
                claims.retain(|k| k != key);
                if claims.is_empty() {
                    self.claims.remove(frontend);
                }
            }
            touched.insert(*frontend);
        }
        for (frontend, entry) in &new {
            match old.get(frontend) {
                Some(before) if before == entry => {}
                Some(_) => {
                    touched.insert(*frontend);
                }
                None => {
                    // A ClusterIP is the API server's to give, once: it goes before any other
                    // claim (an externalIP or LoadBalancer IP naming another Service's ClusterIP
                    // must not take it, whatever the order the API lists them in).
                    let cluster_ip = entry.kind == Kind::ClusterIp;
                    let claims = self.claims.entry(*frontend).or_default();
                    let at = if cluster_ip {
                        let translations = &self.translations;
                        claims
                            .iter()
                            .position(|k| {
                                translations
                                    .get(k)
                                    .and_then(|t| t.get(frontend))
                                    .is_none_or(|e| e.kind != Kind::ClusterIp)
                            })
                            .unwrap_or(claims.len())
                    } else {
                        claims.len()
                    };
                    claims.insert(at, key.clone());
                    if let [first, ..] = claims.as_slice()
                        && first != key
                    {
                        log::warn!("service {key}: {frontend} is service {first}'s already: left to it");
                        self.stats.duplicate_frontends += 1;
                    }
                    touched.insert(*frontend);
                }
            }
        }
        if !new.is_empty() {
            self.translations.insert(key.clone(), new);
        }
    }

    fn count(&mut self, key: &Key, translation: &Translation) {
        if translation.truncated > 0 {
            log::warn!("service {key}: more than {} backends: cut to that many", self.max_backends);
            self.stats.truncated_frontends += translation.truncated as u64;
        }
        if translation.duplicates > 0 {
            log::warn!("service {key}: names {} of its frontends twice: the first is kept", translation.duplicates);
            self.stats.duplicate_frontends += translation.duplicates as u64;
        }
        if translation.unroutable > 0 {
            log::warn!(
                "service {key}: {} frontend or endpoint addresses left out (loopback, unspecified, link-local, \
                 multicast)",
                translation.unroutable
            );
            self.stats.unroutable_addresses += translation.unroutable as u64;
        }
    }

    /// What the sink was told, in frontend order.
    pub fn served(&self) -> BTreeMap<&Frontend, &Entry> {
        self.served.iter().map(|(f, e)| (f, e.as_ref())).collect()
    }
}
