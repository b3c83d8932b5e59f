//! The pinned NetworkPolicy maps of one node, opened and written as the agent would: for the
//! datapath's tests, which write the maps straight.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::maps::{
    Array, HashMap, Map, MapData, PerCpuArray,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_common::{
    Endpoint, FlowKey, IDENTITY_WORLD, IpKey, POLICY_RULE_ANY_PORT_BITS, POLICY_RULE_FULL_BITS, PolicyCount,
    PolicyEndpoint, PolicyFlow, PolicyIdentity, PolicyRule, PolicyRuleKey, host_veth_slot, identity_prefix_len, names,
};

use crate::Testbed;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;

/// The pinned policy maps of one node, opened as the agent opens them.
pub struct Policy {
    pub identities: LpmTrie<MapData, IpKey, PolicyIdentity>,
    pub subjects: Array<MapData, PolicyEndpoint>,
    pub rules: LpmTrie<MapData, PolicyRuleKey, PolicyRule>,
    pub flows: HashMap<MapData, FlowKey, PolicyFlow>,
    pub counts: PerCpuArray<MapData, PolicyCount>,
    pub endpoints: HashMap<MapData, IpKey, Endpoint>,
}

pub fn open(tb: &Testbed, name: &str) -> Map {
    let pin = tb.map_pin(name);
    Map::from_map_data(MapData::from_pin(Path::new(&pin)).unwrap()).unwrap()
}

pub fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

impl Policy {
    pub fn open(tb: &Testbed) -> Self {
        let mut policy = Self {
            identities: LpmTrie::try_from(open(tb, names::POLICY_IDENTITIES)).unwrap(),
            subjects: Array::try_from(open(tb, names::POLICY_ENDPOINTS)).unwrap(),
            rules: LpmTrie::try_from(open(tb, names::POLICY_RULES)).unwrap(),
            flows: HashMap::try_from(open(tb, names::POLICY_FLOWS)).unwrap(),
            counts: PerCpuArray::try_from(open(tb, names::POLICY_COUNTS)).unwrap(),
            endpoints: HashMap::try_from(open(tb, names::ENDPOINTS)).unwrap(),
        };
        policy.identity_prefix(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, IDENTITY_WORLD);
        policy.identity_prefix(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, IDENTITY_WORLD);
        policy
    }

    /// [`Policy::open`], with each pod address of `pods` given its identity.
    pub fn with_identities<I: Into<IpAddr>>(tb: &Testbed, pods: impl IntoIterator<Item = (I, u32)>) -> Self {
        let mut policy = Self::open(tb);
        for (ip, identity) in pods {
            policy.identity(ip, identity);
        }
        policy
    }

    pub fn identity_prefix(&mut self, ip: IpAddr, bits: u32, identity: u32) {
        let key = Key::new(identity_prefix_len(bits), ip_key(ip));
        self.identities.insert(&key, PolicyIdentity { identity, pad: 0 }, 0).unwrap();
    }

    pub fn identity(&mut self, ip: impl Into<IpAddr>, identity: u32) {
        let ip = ip.into();
        self.identity_prefix(ip, if ip.is_ipv4() { 32 } else { 128 }, identity);
    }

    /// Makes the pod at `ip` (on this node) subject `identity`, isolated by `flags`.
    pub fn subject(&mut self, ip: impl Into<IpAddr>, identity: u32, flags: u32, ingress_slot: u32, egress_slot: u32) {
        let slot = self.entry(ip, identity, flags, ingress_slot, egress_slot);
        self.subjects.set(host_veth_slot(slot.ifindex), slot, 0).unwrap();
    }

    /// The `POLICY_ENDPOINTS` entry that makes the pod at `ip` subject `identity`.
    pub fn entry(
        &self,
        ip: impl Into<IpAddr>,
        identity: u32,
        flags: u32,
        ingress_slot: u32,
        egress_slot: u32,
    ) -> PolicyEndpoint {
        let ep = self.endpoints.get(&ip_key(ip.into()), 0).unwrap();
        PolicyEndpoint { ifindex: ep.host_ifindex, flags, owner: ep.owner, identity, ingress_slot, egress_slot, pad: 0 }
    }

    /// `POLICY_ENDPOINTS_BY_IFINDEX`, for pods whose slot another holds.
    pub fn by_ifindex(tb: &Testbed) -> HashMap<MapData, u32, PolicyEndpoint> {
        HashMap::try_from(open(tb, names::POLICY_ENDPOINTS_BY_IFINDEX)).unwrap()
    }

    /// Allows `subject` ↔ `peer` in `direction` for `protocol`, on `port` or every port.
    pub fn allow(&mut self, subject: u32, peer: u32, direction: u8, protocol: u8, port: Option<u16>, slot: u32) {
        self.rules.insert(&rule_key(subject, peer, direction, protocol, port), PolicyRule { slot, pad: 0 }, 0).unwrap();
    }

    /// Takes back what [`Policy::allow`] allowed with the same arguments (a policy changed).
    pub fn disallow(&mut self, subject: u32, peer: u32, direction: u8, protocol: u8, port: Option<u16>) {
        self.rules.remove(&rule_key(subject, peer, direction, protocol, port)).unwrap();
    }

    /// `POLICY_FLOWS` entries with `ip` on either side.
    pub fn flows_of(&self, ip: impl Into<IpAddr>) -> usize {
        let key = ip_key(ip.into()).addr;
        self.flows.keys().filter_map(Result::ok).filter(|k| k.src_addr == key || k.dst_addr == key).count()
    }

    pub fn all_flows(&self) -> Vec<FlowKey> {
        self.flows.keys().filter_map(Result::ok).collect()
    }

    pub fn forget_flows(&mut self) {
        for key in self.all_flows() {
            let _ = self.flows.remove(&key);
        }
    }

    /// (allowed, denied) flows counted on `slot`, over the CPUs.
    pub fn counted(&self, slot: u32) -> (u64, u64) {
        let values = self.counts.get(&slot, 0).unwrap();
        values.iter().fold((0, 0), |(a, d), c| (a + c.allowed_flows, d + c.denied_flows))
    }
}

/// The `POLICY_RULES` key of `subject` ↔ `peer` in `direction` for `protocol`, on `port` or
/// every port.
fn rule_key(subject: u32, peer: u32, direction: u8, protocol: u8, port: Option<u16>) -> Key<PolicyRuleKey> {
    let bits = if port.is_some() { POLICY_RULE_FULL_BITS } else { POLICY_RULE_ANY_PORT_BITS };
    Key::new(
        bits,
        PolicyRuleKey { subject, peer, direction, protocol, port_be: port.unwrap_or_default().to_be_bytes() },
    )
}

pub const A: u32 = 256;
pub const B: u32 = 257;
pub const C: u32 = 258;

/// `ebpf-cni policy-set` on the node with `input` (`{"namespaces", "pods", "networkPolicies"}`,
/// the API's JSON): what it says it wrote.
pub fn policy_set(tb: &Testbed, input: &serde_json::Value) -> serde_json::Value {
    let file = tb.data_dir().join("policy-input.json");
    std::fs::create_dir_all(tb.data_dir()).unwrap();
    std::fs::write(&file, input.to_string()).unwrap();
    let out = std::process::Command::new(&tb.plugin.binary)
        .args(["policy-set", "--network", &tb.network, "--bpffs-root"])
        .arg(tb.bpffs_root())
        .arg("--input")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "policy-set: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A running pod of namespace `x` at `ip`, as the API lists it.
pub fn pod_object(name: &str, labels: serde_json::Value, ip: IpAddr) -> serde_json::Value {
    pod_object_in("x", name, labels, ip)
}

/// A running pod of `namespace` at `ip`, as the API lists it.
pub fn pod_object_in(
    namespace: &str,
    name: &str,
    labels: serde_json::Value,
    ip: impl Into<IpAddr>,
) -> serde_json::Value {
    let ip = ip.into();
    serde_json::json!({
        "metadata": {"namespace": namespace, "name": name, "labels": labels},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]},
    })
}
