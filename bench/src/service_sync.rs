//! EndpointSlice event → datapath at many Services: `ebpf-cni agent` (kubeProxyReplacement on,
//! its socket LB attached to a cgroup of the bench's own) reads the Services and EndpointSlices
//! of a fake API server (`ebpf_cni_tests::FakeStore`, the API's own JSON) on a fresh node. Timed:
//! from the agent's start until every Service is in `SVC_FRONTENDS`, then, one after another,
//! from the store's write of a changed EndpointSlice until the Service's backend slot holds the
//! new endpoint. The maps are read directly (a lookup per poll): `ebpf-cni inspect services`
//! walks every entry, milliseconds at 10,000 Services, which would be timed with the change.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, Map, MapData};
use ebpf_cni_tests::{
    FakeStore, Plugin, Testbed,
    agent::RunningAgent,
    cgroup::TestCgroup,
    fake_store::{NODES, SERVICES, SLICES},
};
use ebpf_common::{Backend, BackendKey, FAMILY_IPV4, Service, ServiceKey, ipv4_in_16, names};
use serde_json::{Value, json};

use crate::{
    service_set::{OTHER_PORT, TARGET_PORT, other_endpoints, other_ip},
    stats::Samples,
    topology,
};

const API: &str = "127.0.0.1:6443";

pub struct Sync {
    /// Agent start → every Service in the maps, ms.
    pub first_ms: f64,
    /// Each change's event → datapath, ms.
    pub changes_ms: Samples,
}

/// `services` Services, then `changes` changes of one Service's endpoints.
pub fn measure(ours: &Plugin, services: usize, changes: usize) -> Result<Sync> {
    let tb = Testbed::with_plugin("bsy", "10.242.0.0/24", ours.clone())?;
    let cgroup = TestCgroup::create(&topology::unique("sync"))?;
    let node_file = topology::node_file(&tb, &cgroup)?;
    let store = FakeStore::start(&tb.node.name, API.parse()?);
    let node = json!({ "metadata": { "name": "node-1" }, "spec": { "podCIDR": tb.subnet },
                       "status": { "addresses": [{ "type": "InternalIP", "address": "192.0.2.10" }] } });
    store.put(NODES, [node]);
    store.put(SERVICES, (0..services).map(service));
    store.put(SLICES, (0..services).map(|i| slice(i, &other_endpoints(i))));
    let started = Instant::now();
    let args = ["--api-server", &format!("http://{API}"), "--node-conf", &node_file, "--interval", "1"];
    let agent = RunningAgent::start(&tb, "node-1", &args)?;
    let maps = wait(&agent, Duration::from_secs(60), || Maps::open(&tb).ok().filter(|m| m.count() >= services))?;
    let first_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut changes_ms = Samples::default();
    let original = other_endpoints(0);
    for change in 0..changes {
        // The first endpoint moves back and forth between two addresses.
        let mut endpoints = original;
        let moved = Ipv4Addr::new(10, 245, 0, 1 + (change % 2) as u8);
        endpoints[0] = SocketAddrV4::new(moved, TARGET_PORT);
        let written = Instant::now();
        store.put(SLICES, [slice(0, &endpoints)]);
        let landed = || maps.backends(other_ip(0), OTHER_PORT).contains(&moved).then_some(());
        wait(&agent, Duration::from_secs(5), landed)?;
        changes_ms.push(written.elapsed().as_secs_f64() * 1e3);
        // Apart, so that each change is its own event rather than a burst the agent batches.
        sleep(Duration::from_millis(20));
    }
    drop(agent);
    Ok(Sync { first_ms, changes_ms })
}

/// Polls `done` every millisecond until it returns something, for at most `limit`.
fn wait<T>(agent: &RunningAgent, limit: Duration, mut done: impl FnMut() -> Option<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = done() {
            return Ok(value);
        }
        if start.elapsed() > limit {
            bail!("the agent did not write the Services within {limit:?}; its log:\n{}", agent.log());
        }
        sleep(Duration::from_millis(1));
    }
}

fn service(i: usize) -> Value {
    let ip = other_ip(i).to_string();
    json!({ "metadata": { "namespace": "bench", "name": format!("other-{i}") },
            "spec": { "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                      "ports": [{ "name": "http", "port": OTHER_PORT, "protocol": "TCP", "targetPort": TARGET_PORT }] } })
}

fn slice(i: usize, endpoints: &[SocketAddrV4]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|e| json!({ "addresses": [e.ip().to_string()], "conditions": { "ready": true, "serving": true, "terminating": false } }))
        .collect();
    json!({ "metadata": { "namespace": "bench", "name": format!("other-{i}-1"),
                          "labels": { "kubernetes.io/service-name": format!("other-{i}") } },
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{ "name": "http", "port": TARGET_PORT, "protocol": "TCP" }] })
}

/// The socket LB's pinned frontend and backend maps, read as its programs read them.
struct Maps {
    frontends: HashMap<MapData, ServiceKey, Service>,
    backends: HashMap<MapData, BackendKey, Backend>,
}

impl Maps {
    fn open(tb: &Testbed) -> Result<Self> {
        let open = |name: &str| -> Result<Map> {
            let data = MapData::from_pin(tb.map_pin(name)).with_context(|| format!("opening pinned {name}"))?;
            Ok(Map::from_map_data(data)?)
        };
        Ok(Self {
            frontends: HashMap::try_from(open(names::SVC_FRONTENDS)?)?,
            backends: HashMap::try_from(open(names::SVC_BACKENDS)?)?,
        })
    }

    fn count(&self) -> usize {
        self.frontends.keys().filter(Result::is_ok).count()
    }

    /// The IPv4 TCP frontend's backends, from the bank its entry names (the agent orders them
    /// its own way). None yet, or a read failing: empty, and polled again.
    fn backends(&self, ip: Ipv4Addr, port: u16) -> Vec<Ipv4Addr> {
        let key = ServiceKey { addr: ipv4_in_16(ip.octets()), port, protocol: 6, family: FAMILY_IPV4 };
        let Ok(service) = self.frontends.get(&key, 0) else { return Vec::new() };
        (0..service.count)
            .filter_map(|index| {
                let slot = BackendKey { service: service.id, index, bank: service.bank, pad: 0 };
                let b = self.backends.get(&slot, 0).ok()?;
                Some(Ipv4Addr::new(b.addr[0], b.addr[1], b.addr[2], b.addr[3]))
            })
            .collect()
    }
}
