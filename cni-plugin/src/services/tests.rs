//! The model against kube-proxy's rules, one rule per test, with Services and EndpointSlices
//! written as the API server sends them.
use std::collections::BTreeMap;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::{Value, json};

use super::{
    frontend::{Entry, Frontend, Kind, Protocol, ServiceSink, WhenEmpty},
    model::Model,
    translate::Node,
};

/// Remembers what it was told, as the datapath would hold it.
#[derive(Default)]
struct Table {
    entries: BTreeMap<Frontend, Entry>,
    calls: usize,
}

impl ServiceSink for Table {
    fn upsert(&mut self, frontend: &Frontend, entry: &Entry) {
        self.calls += 1;
        self.entries.insert(*frontend, entry.clone());
    }

    fn remove(&mut self, frontend: &Frontend) {
        self.calls += 1;
        assert!(self.entries.remove(frontend).is_some(), "{frontend} was never set");
    }
}

impl Table {
    fn at(&self, frontend: &str) -> &Entry {
        self.entries.get(&fe(frontend)).unwrap_or_else(|| panic!("no {frontend} in {:?}", self.entries.keys()))
    }

    /// `addr:port` of each backend.
    fn backends(&self, frontend: &str) -> Vec<String> {
        self.at(frontend).backends.iter().map(|b| socket(b.addr, b.port)).collect()
    }
}

fn socket(addr: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

/// `10.96.0.1:80/TCP`, `[fd00::1]:80/UDP`.
fn fe(text: &str) -> Frontend {
    let (addr, protocol) = text.rsplit_once('/').unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let protocol = if protocol == "UDP" { Protocol::Udp } else { Protocol::Tcp };
    Frontend { addr: addr.ip(), port: addr.port(), protocol }
}

fn model() -> Model {
    let mut model = Model::new(Node { name: "me".into(), addrs: vec![] }, 10);
    model.set_node_addrs(vec!["192.168.1.10".parse().unwrap(), "fd00::10".parse().unwrap()]);
    model.list_services(vec![]);
    model
}

fn service(name: &str, spec: Value) -> Service {
    let mut spec = spec;
    if spec.get("ports").is_none() {
        spec["ports"] = json!([{ "name": "http", "port": 80, "targetPort": 8080 }]);
    }
    serde_json::from_value(json!({ "metadata": { "namespace": "ns", "name": name }, "spec": spec })).unwrap()
}

fn cluster_ip(name: &str, ip: &str) -> Service {
    service(name, json!({ "clusterIP": ip, "clusterIPs": [ip] }))
}

/// An endpoint: address, node, and its conditions (ready, serving, terminating).
fn ep(addr: &str, node: &str, conditions: (bool, bool, bool)) -> Value {
    let (ready, serving, terminating) = conditions;
    json!({ "addresses": [addr], "nodeName": node, "zone": "z1",
            "conditions": { "ready": ready, "serving": serving, "terminating": terminating } })
}

const READY: (bool, bool, bool) = (true, true, false);
const TERMINATING: (bool, bool, bool) = (false, true, true);
const NOT_READY: (bool, bool, bool) = (false, false, false);

fn slice(name: &str, service: &str, family: &str, endpoints: Vec<Value>) -> EndpointSlice {
    slice_with_ports(name, service, family, endpoints, json!([{ "name": "http", "port": 8080, "protocol": "TCP" }]))
}

fn slice_with_ports(name: &str, service: &str, family: &str, endpoints: Vec<Value>, ports: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": { "namespace": "ns", "name": name, "labels": { "kubernetes.io/service-name": service } },
        "addressType": family, "endpoints": endpoints, "ports": ports,
    }))
    .unwrap()
}

#[test]
fn a_cluster_ip_and_its_ready_endpoints() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("web", "10.96.0.1"));
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![ep("10.1.0.3", "n2", READY), ep("10.1.0.2", "me", READY)]));
    model.apply_slice(&slice("web-b", "web", "IPv4", vec![ep("10.1.0.4", "n3", NOT_READY)]));
    let changed = model.flush(&mut table);
    assert_eq!(changed.into_iter().collect::<Vec<_>>(), [fe("10.96.0.1:80/TCP")]);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), ["10.1.0.2:8080", "10.1.0.3:8080"], "in order, ready ones");
    let entry = table.at("10.96.0.1:80/TCP");
    assert_eq!(
        (entry.service.as_str(), entry.kind, entry.when_empty),
        ("ns/web:http", Kind::ClusterIp, WhenEmpty::Reject)
    );
    assert_eq!(entry.backends[0].node.as_deref(), Some("me"));
    assert_eq!(entry.backends[0].zone.as_deref(), Some("z1"));
    assert!(model.flush(&mut table).is_empty(), "nothing changed since");
}

#[test]
fn terminating_endpoints_only_when_none_is_ready() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("web", "10.96.0.1"));
    let old = || ep("10.1.0.2", "n2", TERMINATING);
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![old(), ep("10.1.0.3", "n2", READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), ["10.1.0.3:8080"]);
    // The ready one goes: the terminating one still serving carries the Service.
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![old(), ep("10.1.0.3", "n2", NOT_READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), ["10.1.0.2:8080"]);
    assert!(table.at("10.96.0.1:80/TCP").backends[0].terminating);
    // A new ready one: the terminating one is no longer chosen.
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![old(), ep("10.1.0.4", "n2", READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), ["10.1.0.4:8080"]);
    // Nothing left at all: the frontend stays, empty, and rejects.
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![ep("10.1.0.2", "n2", (false, false, true))]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), Vec::<String>::new());
    assert_eq!(table.at("10.96.0.1:80/TCP").when_empty, WhenEmpty::Reject);
}

#[test]
fn unset_conditions_mean_ready() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("web", "10.96.0.1"));
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![json!({ "addresses": ["10.1.0.2"] })]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.1:80/TCP"), ["10.1.0.2:8080"]);
}

#[test]
fn headless_and_other_proxies_services_are_skipped() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&service("headless", json!({ "clusterIP": "None", "clusterIPs": ["None"] })));
    let mut other = cluster_ip("other", "10.96.0.2");
    other.metadata.labels = Some([("service.kubernetes.io/service-proxy-name".into(), "x".into())].into());
    model.apply_service(&other);
    model.apply_service(&service("name", json!({ "type": "ExternalName", "externalName": "example.com" })));
    model.apply_slice(&slice("headless-a", "headless", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    assert!(model.flush(&mut table).is_empty());
    assert_eq!(model.stats.services_skipped, 3);
    assert_eq!(model.stats.orphan_slices, 0, "a skipped Service's slices are not orphans");
}

#[test]
fn node_ports_external_ips_and_load_balancer_ips() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&service(
        "lb",
        json!({ "type": "LoadBalancer", "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"],
                "externalIPs": ["198.51.100.7", "2001:db8::7"],
                "ports": [{ "name": "http", "port": 80, "nodePort": 30080 }] }),
    ));
    let mut lb = service("lb", json!({}));
    lb.spec = model_spec_of_lb();
    lb.status = serde_json::from_value(json!({ "loadBalancer": { "ingress": [
        { "ip": "203.0.113.9" }, { "ip": "203.0.113.10", "ipMode": "Proxy" }, { "hostname": "lb.example.com" }] } }))
    .unwrap();
    model.apply_service(&lb);
    model.apply_slice(&slice("lb-a", "lb", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    model.flush(&mut table);
    let frontends: Vec<String> = table.entries.keys().map(ToString::to_string).collect();
    assert_eq!(
        frontends,
        ["10.96.0.5:80/Tcp", "192.168.1.10:30080/Tcp", "198.51.100.7:80/Tcp", "203.0.113.9:80/Tcp"],
        "an IPv4 Service: no IPv6 node port or external IP; not the proxied LB IP"
    );
    assert_eq!(table.at("192.168.1.10:30080/TCP").kind, Kind::NodePort);
    assert_eq!(table.at("198.51.100.7:80/TCP").kind, Kind::ExternalIp);
    assert_eq!(table.at("203.0.113.9:80/TCP").kind, Kind::LoadBalancer);
    for frontend in &table.entries {
        assert_eq!(table.backends(&frontend.0.to_string().to_uppercase()), ["10.1.0.2:8080"]);
    }
    // The node's addresses change: the node ports move, the rest stays.
    model.set_node_addrs(vec!["192.168.1.11".parse().unwrap()]);
    let changed: Vec<String> = model.flush(&mut table).iter().map(ToString::to_string).collect();
    assert_eq!(changed, ["192.168.1.10:30080/Tcp", "192.168.1.11:30080/Tcp"]);
}

fn model_spec_of_lb() -> Option<k8s_openapi::api::core::v1::ServiceSpec> {
    serde_json::from_value(json!({ "type": "LoadBalancer", "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"],
        "externalIPs": ["198.51.100.7", "2001:db8::7"], "ports": [{ "name": "http", "port": 80, "nodePort": 30080 }] }))
    .unwrap()
}

#[test]
fn traffic_policies_local() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&service(
        "loc",
        json!({ "type": "NodePort", "clusterIP": "10.96.0.6", "externalTrafficPolicy": "Local",
                "internalTrafficPolicy": "Local", "ports": [{ "name": "http", "port": 80, "nodePort": 30081 }] }),
    ));
    let endpoints = vec![ep("10.1.0.2", "me", READY), ep("10.1.0.3", "n2", READY)];
    model.apply_slice(&slice("loc-a", "loc", "IPv4", endpoints));
    model.flush(&mut table);
    for frontend in ["10.96.0.6:80/TCP", "192.168.1.10:30081/TCP"] {
        assert_eq!(table.backends(frontend), ["10.1.0.2:8080"], "{frontend}: this node's only");
        assert!(table.at(frontend).local_only);
    }
    assert_eq!(table.at("10.96.0.6:80/TCP").internal, None);
    let internal = table.at("192.168.1.10:30081/TCP").internal.as_ref().unwrap();
    assert_eq!(internal.len(), 2, "this node's own clients reach every endpoint");
    // No local endpoint left: dropped, not rejected (others exist).
    model.apply_slice(&slice("loc-a", "loc", "IPv4", vec![ep("10.1.0.3", "n2", READY)]));
    model.flush(&mut table);
    let entry = table.at("192.168.1.10:30081/TCP");
    assert!(entry.backends.is_empty());
    assert_eq!(entry.when_empty, WhenEmpty::Drop);
    // A local terminating one, while a remote one is ready: the local set falls back to it.
    model.apply_slice(&slice(
        "loc-a",
        "loc",
        "IPv4",
        vec![ep("10.1.0.3", "n2", READY), ep("10.1.0.2", "me", TERMINATING)],
    ));
    model.flush(&mut table);
    assert_eq!(table.backends("192.168.1.10:30081/TCP"), ["10.1.0.2:8080"]);
    assert_eq!(table.backends("10.96.0.6:80/TCP"), ["10.1.0.2:8080"]);
}

#[test]
fn session_affinity() {
    let (mut model, mut table) = (model(), Table::default());
    let mut sticky = cluster_ip("sticky", "10.96.0.7");
    sticky.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
    model.apply_service(&sticky);
    let mut timed = cluster_ip("timed", "10.96.0.8");
    let spec = timed.spec.as_mut().unwrap();
    spec.session_affinity = Some("ClientIP".into());
    spec.session_affinity_config = serde_json::from_value(json!({ "clientIP": { "timeoutSeconds": 60 } })).unwrap();
    model.apply_service(&timed);
    model.apply_service(&cluster_ip("plain", "10.96.0.9"));
    model.flush(&mut table);
    assert_eq!(table.at("10.96.0.7:80/TCP").affinity_seconds, Some(10800), "the API's default");
    assert_eq!(table.at("10.96.0.8:80/TCP").affinity_seconds, Some(60));
    assert_eq!(table.at("10.96.0.9:80/TCP").affinity_seconds, None);
}

#[test]
fn target_ports_by_name_through_the_slices() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&service(
        "multi",
        json!({ "clusterIP": "10.96.0.10", "ports": [
            { "name": "http", "port": 80, "targetPort": "web" },
            { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353 },
            { "name": "sctp", "port": 9, "protocol": "SCTP" }] }),
    ));
    // Pods of two versions name "web" on different ports: one slice each.
    let ports = |http: u16| json!([{ "name": "http", "port": http, "protocol": "TCP" }, { "name": "dns", "port": 5353, "protocol": "UDP" }]);
    model.apply_slice(&slice_with_ports("multi-a", "multi", "IPv4", vec![ep("10.1.0.2", "n2", READY)], ports(8080)));
    model.apply_slice(&slice_with_ports("multi-b", "multi", "IPv4", vec![ep("10.1.0.3", "n2", READY)], ports(9090)));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.10:80/TCP"), ["10.1.0.2:8080", "10.1.0.3:9090"]);
    assert_eq!(table.backends("10.96.0.10:53/UDP"), ["10.1.0.2:5353", "10.1.0.3:5353"]);
    assert_eq!(table.entries.len(), 2, "SCTP is not served");
    assert_eq!(model.stats.ports_skipped, 1);
}

#[test]
fn dual_stack() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&service(
        "dual",
        json!({ "type": "NodePort", "clusterIP": "10.96.0.11", "clusterIPs": ["10.96.0.11", "fd00:96::11"],
                "ipFamilies": ["IPv4", "IPv6"], "ports": [{ "name": "http", "port": 80, "nodePort": 30082 }] }),
    ));
    model.apply_slice(&slice("dual-4", "dual", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    model.apply_slice(&slice("dual-6", "dual", "IPv6", vec![ep("fd00:1::2", "n2", READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.11:80/TCP"), ["10.1.0.2:8080"]);
    assert_eq!(table.backends("[fd00:96::11]:80/TCP"), ["[fd00:1::2]:8080"]);
    assert_eq!(table.backends("192.168.1.10:30082/TCP"), ["10.1.0.2:8080"]);
    assert_eq!(table.backends("[fd00::10]:30082/TCP"), ["[fd00:1::2]:8080"]);
    // The IPv6 slice goes: only the IPv6 frontends change.
    model.delete_slice(&slice("dual-6", "dual", "IPv6", vec![]));
    let changed: Vec<String> = model.flush(&mut table).iter().map(ToString::to_string).collect();
    assert_eq!(changed, ["[fd00::10]:30082/Tcp", "[fd00:96::11]:80/Tcp"]);
}

#[test]
fn churn_touches_only_the_changed_frontends() {
    let (mut model, mut table) = (model(), Table::default());
    for i in 0..100 {
        model.apply_service(&cluster_ip(&format!("s{i}"), &format!("10.96.1.{i}")));
        model.apply_slice(&slice(&format!("s{i}-a"), &format!("s{i}"), "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    }
    assert_eq!(model.flush(&mut table).len(), 100);
    let calls = table.calls;
    // An endpoint added, then one terminating, then removed: one frontend each time.
    let endpoints = |extra: Value| vec![ep("10.1.0.2", "n2", READY), extra];
    model.apply_slice(&slice("s7-a", "s7", "IPv4", endpoints(ep("10.1.0.9", "n2", READY))));
    assert_eq!(model.flush(&mut table).len(), 1);
    assert_eq!(table.backends("10.96.1.7:80/TCP"), ["10.1.0.2:8080", "10.1.0.9:8080"]);
    model.apply_slice(&slice("s7-a", "s7", "IPv4", endpoints(ep("10.1.0.9", "n2", TERMINATING))));
    assert_eq!(model.flush(&mut table).len(), 1);
    assert_eq!(table.backends("10.96.1.7:80/TCP"), ["10.1.0.2:8080"]);
    // Terminating: no new connection, but the open ones drain (nothing settles them).
    let draining =
        |table: &Table| table.at("10.96.1.7:80/TCP").draining.iter().map(|b| b.addr.to_string()).collect::<Vec<_>>();
    assert_eq!(draining(&table), ["10.1.0.9"]);
    model.apply_slice(&slice("s7-a", "s7", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    // Gone from the slice: the entry changes (nothing drains), so its connections are settled.
    assert_eq!(model.flush(&mut table).len(), 1);
    assert!(draining(&table).is_empty());
    // A Service deleted: its frontend only.
    model.delete_service(&cluster_ip("s8", "10.96.1.8"));
    assert_eq!(model.flush(&mut table).into_iter().collect::<Vec<_>>(), [fe("10.96.1.8:80/TCP")]);
    assert_eq!(table.calls, calls + 4);
    assert_eq!(table.entries.len(), 99);
    // A new list without s9 and s9's slice: both go, the rest is untouched.
    let services =
        (0..100).filter(|i| ![8, 9].contains(i)).map(|i| cluster_ip(&format!("s{i}"), &format!("10.96.1.{i}")));
    model.list_services(services.collect());
    assert_eq!(model.flush(&mut table).into_iter().collect::<Vec<_>>(), [fe("10.96.1.9:80/TCP")]);
}

#[test]
fn duplicate_cluster_ips_leave_the_first_alone() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("first", "10.96.0.12"));
    model.apply_slice(&slice("first-a", "first", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    model.flush(&mut table);
    model.apply_service(&cluster_ip("second", "10.96.0.12"));
    model.apply_slice(&slice("second-a", "second", "IPv4", vec![ep("10.1.0.3", "n2", READY)]));
    assert!(model.flush(&mut table).is_empty(), "the first keeps its translation");
    assert_eq!(table.backends("10.96.0.12:80/TCP"), ["10.1.0.2:8080"]);
    assert_eq!(model.stats.duplicate_frontends, 1);
    // The first goes: the second takes the address over.
    model.delete_service(&cluster_ip("first", "10.96.0.12"));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.12:80/TCP"), ["10.1.0.3:8080"]);
}

#[test]
fn bad_input_is_counted_and_harms_no_other_service() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("good", "10.96.0.13"));
    model.apply_slice(&slice("good-a", "good", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    model.flush(&mut table);
    let before = table.entries.clone();
    model.apply_service(&service("noports", json!({ "clusterIP": "10.96.0.14", "ports": [] })));
    model.apply_service(&service("badip", json!({ "clusterIP": "10.96.0.300", "clusterIPs": ["10.96.0.300"] })));
    model.apply_slice(&slice("ghost-a", "ghost", "IPv4", vec![ep("10.1.0.5", "n2", READY)]));
    let unlabelled: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "namespace": "ns", "name": "nolabel" }, "addressType": "IPv4", "endpoints": [] }))
    .unwrap();
    model.apply_slice(&unlabelled);
    model.apply_slice(&slice("good-b", "good", "IPv4", vec![ep("not-an-ip", "n2", READY)]));
    // Far more endpoints than the API allows in one slice: ignored whole.
    let huge: Vec<Value> =
        (0..100_000u32).map(|i| ep(&std::net::Ipv4Addr::from(0x0a02_0000 + i).to_string(), "n2", READY)).collect();
    model.apply_slice(&slice("good-c", "good", "IPv4", huge));
    assert!(model.flush(&mut table).is_empty(), "{:?}", table.entries.keys());
    assert_eq!(table.entries, before);
    let stats = &model.stats;
    assert_eq!((stats.bad_services, stats.bad_addresses), (2, 2));
    assert_eq!((stats.orphan_slices, stats.oversized_slices), (2, 1));
}

#[test]
fn too_many_backends_are_cut_and_counted() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("big", "10.96.0.15"));
    for s in 0..3 {
        let endpoints = (0..5).map(|i| ep(&format!("10.3.{s}.{i}"), "n2", READY)).collect();
        model.apply_slice(&slice(&format!("big-{s}"), "big", "IPv4", endpoints));
    }
    model.flush(&mut table);
    assert_eq!(table.at("10.96.0.15:80/TCP").backends.len(), 10, "the model's limit in these tests");
    assert_eq!(model.stats.truncated_frontends, 1);
}

#[test]
fn an_endpoint_in_two_slices_counts_once() {
    let (mut model, mut table) = (model(), Table::default());
    model.apply_service(&cluster_ip("web", "10.96.0.16"));
    model.apply_slice(&slice("web-a", "web", "IPv4", vec![ep("10.1.0.2", "n2", NOT_READY)]));
    model.apply_slice(&slice("web-b", "web", "IPv4", vec![ep("10.1.0.2", "n2", READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.16:80/TCP"), ["10.1.0.2:8080"]);
}

#[test]
fn an_external_ip_naming_another_services_cluster_ip_never_takes_it() {
    let (mut model, mut table) = (model(), Table::default());
    // Listed first (the API lists by namespace and name), it claims kube-dns's ClusterIP.
    let evil = service(
        "evil",
        json!({ "clusterIP": "10.96.0.40", "clusterIPs": ["10.96.0.40"], "externalIPs": ["10.96.0.10"],
                                        "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 }] }),
    );
    model.apply_service(&evil);
    model.apply_slice(&slice("evil-a", "evil", "IPv4", vec![ep("10.1.0.66", "n2", READY)]));
    model.apply_service(&cluster_ip("dns", "10.96.0.10"));
    model.apply_slice(&slice("dns-a", "dns", "IPv4", vec![ep("10.1.0.53", "n2", READY)]));
    model.flush(&mut table);
    assert_eq!(table.backends("10.96.0.10:80/TCP"), ["10.1.0.53:8080"], "the ClusterIP is its own Service's");
}

#[test]
fn loopback_link_local_and_multicast_are_no_services() {
    let (mut model, mut table) = (model(), Table::default());
    let spec = json!({ "clusterIP": "10.96.0.41", "clusterIPs": ["10.96.0.41"],
                       "externalIPs": ["127.0.0.1", "169.254.169.254", "224.0.0.1", "0.0.0.0", "192.0.2.80"],
                       "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 }] });
    model.apply_service(&service("web", spec));
    let endpoints = ["10.1.0.7", "127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1"];
    model.apply_slice(&slice("web-a", "web", "IPv4", endpoints.iter().map(|a| ep(a, "n2", READY)).collect()));
    model.flush(&mut table);
    let mut frontends: Vec<String> = table.entries.keys().map(ToString::to_string).collect();
    frontends.sort();
    assert_eq!(frontends, ["10.96.0.41:80/Tcp", "192.0.2.80:80/Tcp"]);
    assert_eq!(table.backends("10.96.0.41:80/TCP"), ["10.1.0.7:8080"]);
    assert_eq!(model.stats.unroutable_addresses, 4 + 4);
}
