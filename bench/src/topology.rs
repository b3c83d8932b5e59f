//! The paths a pod→pod figure is measured on, each built fresh in namespaces of its own and
//! removed when dropped: two pods of one node attached by ebpf-cni or by bridge, two namespaces
//! joined by a bare veth pair (the ceiling for any veth-based path), and loopback in one
//! namespace (the ceiling of the TCP/IP stack alone).
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{NetnsGuard, Plugin, Testbed, cgroup::TestCgroup, run_in};
use serde_json::{Value, json};

/// Every path runs at this MTU (the veth default), so none wins by packet size.
pub const MTU: u32 = 1500;

/// The pods' IPv6 range when a figure is measured over IPv6 (both plugins get the same
/// dual-stack IPAM: this and the IPv4 subnet, host-local's one range set per family).
const POD_SUBNET_V6: &str = "fd00:10:242::/64";

/// The address family a pair's traffic uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    V4,
    V6,
}

static BUILT: AtomicU32 = AtomicU32::new(0);

/// A column of the results. `EbpfCniKubeProxy`, `BridgeNft` and `OwnPodToPod` exist in the
/// Service section only, where `EbpfCni` is ebpf-cni's own Service LB and `Bridge` is bridge
/// with kube-proxy's iptables rules; `BareNodes` and `Routed` in the cross-node section only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    EbpfCni,
    Bridge,
    BareVeth,
    Loopback,
    /// ebpf-cni with kube-proxy's iptables rules (no socket LB).
    EbpfCniKubeProxy,
    /// bridge with kube-proxy's nftables rules.
    BridgeNft,
    /// ebpf-cni pod → pod on the same node as its ClusterIP figure: what a Service may cost.
    OwnPodToPod,
    /// Two node namespaces talking over the wire between them, no pod: the cross-node ceiling.
    BareNodes,
    /// ebpf-cni's pods with the floor program in front of `from_pod` (`floor.rs`).
    Floor,
    /// Two namespaces each joined by a veth to a third that forwards between them, no plugin,
    /// no netfilter rule, no BPF: what one kernel forwarding hop costs (the cross-node section).
    Routed,
    /// ebpf-cni without any NetworkPolicy (the policy section, where `EbpfCni` has 1,000).
    NoPolicy,
    /// The previous release's ebpf-cni, without policy (the policy section, `--previous`).
    Previous,
}

impl Path {
    /// The pod → pod paths.
    pub const ALL: [Self; 4] = [Self::EbpfCni, Self::Bridge, Self::BareVeth, Self::Loopback];
    /// The datapath sections' paths: the pod → pod ones and the floor.
    pub const DATAPATH: [Self; 5] = [Self::EbpfCni, Self::Floor, Self::Bridge, Self::BareVeth, Self::Loopback];
    pub const PLUGINS: [Self; 2] = [Self::EbpfCni, Self::Bridge];
    /// Every column, in the tables' order.
    pub const EVERY: [Self; 12] = [
        Self::EbpfCni,
        Self::Bridge,
        Self::BareVeth,
        Self::Loopback,
        Self::Floor,
        Self::EbpfCniKubeProxy,
        Self::BridgeNft,
        Self::OwnPodToPod,
        Self::BareNodes,
        Self::Routed,
        Self::NoPolicy,
        Self::Previous,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::EbpfCni => "ebpf-cni",
            Self::Bridge => "bridge",
            Self::BareVeth => "bare veth",
            Self::Loopback => "loopback",
            Self::EbpfCniKubeProxy => "ebpf-cni + kube-proxy",
            Self::BridgeNft => "bridge + nftables",
            Self::OwnPodToPod => "ebpf-cni pod → pod",
            Self::BareNodes => "bare node → node",
            Self::Floor => "floor (MAC rewrite + redirect_peer)",
            Self::Routed => "routed (1 hop, no plugin)",
            Self::NoPolicy => "ebpf-cni, no policy",
            Self::Previous => "previous release",
        }
    }

    /// The plugin whose pods a path runs between.
    pub fn base(self) -> Self {
        match self {
            Self::Bridge | Self::BridgeNft => Self::Bridge,
            Self::EbpfCni
            | Self::EbpfCniKubeProxy
            | Self::OwnPodToPod
            | Self::Floor
            | Self::NoPolicy
            | Self::Previous => Self::EbpfCni,
            other => other,
        }
    }

    /// The plugin binary of a CNI path.
    pub fn plugin(self, ours: &Plugin) -> Plugin {
        match self.base() {
            Self::Bridge => Plugin { binary: "/usr/lib/cni/bridge".into() },
            _ => ours.clone(),
        }
    }

    /// The network configuration of a CNI path: ours as the testbed writes it, or bridge as a
    /// node operator sets it up (gateway and pods' default route on the bridge, ipMasq, the
    /// same host-local pool); both at [`MTU`]. For IPv6 both get the same dual-stack pool.
    pub fn conf(self, tb: &Testbed, family: Family) -> Value {
        let mut conf = match self.base() {
            Self::Bridge => json!({
                "cniVersion": "1.0.0",
                "name": tb.network,
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "isDefaultGateway": true,
                "ipMasq": true,
                "ipam": { "type": "host-local", "subnet": tb.subnet, "dataDir": tb.data_dir() },
            }),
            _ => tb.conf("1.0.0"),
        };
        conf["mtu"] = json!(MTU);
        if family == Family::V6 {
            let ranges = json!([[{ "subnet": tb.subnet }], [{ "subnet": POD_SUBNET_V6 }]]);
            conf["ipam"] = json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() });
        }
        conf
    }
}

/// A client and a server namespace, the server's address, and the address clients dial.
pub struct Pair {
    pub client_ns: String,
    pub server_ns: String,
    /// Where the server listens.
    pub server_ip: String,
    /// Where clients connect: the server's own address, or a Service's that leads to it.
    pub dial_ip: String,
    keep: Keep,
    /// Where the clients run, when the socket LB must translate their connections; after
    /// `keep`, so that the node goes (its programs detached) before the cgroup is removed.
    cgroup: Option<TestCgroup>,
}

/// What the pair holds, removed when it is dropped.
enum Keep {
    Node {
        node: Box<Testbed>,
    },
    /// Two nodes, the client's first (`cross_node.rs`).
    Nodes {
        nodes: Box<[Testbed; 2]>,
    },
    Namespaces {
        _namespaces: Vec<NetnsGuard>,
    },
    /// The namespaces belong to somebody else (a cluster the caller holds).
    Borrowed,
}

impl Pair {
    /// Between namespaces the caller keeps alive.
    pub fn borrowed(client_ns: &str, server_ns: &str, server_ip: &str) -> Self {
        Self {
            client_ns: client_ns.into(),
            server_ns: server_ns.into(),
            server_ip: server_ip.into(),
            dial_ip: server_ip.into(),
            keep: Keep::Borrowed,
            cgroup: None,
        }
    }

    /// Between a pod of each node: they (and the wire between them) go with the pair.
    pub fn across(nodes: [Testbed; 2], server_ip: &str) -> Self {
        Self {
            client_ns: nodes[0].pods[0].netns.name.clone(),
            server_ns: nodes[1].pods[0].netns.name.clone(),
            server_ip: server_ip.into(),
            dial_ip: server_ip.into(),
            keep: Keep::Nodes { nodes: Box::new(nodes) },
            cgroup: None,
        }
    }

    /// Between the first namespace and the last; they (and any between them) go with the pair.
    pub fn owning<const N: usize>(namespaces: [NetnsGuard; N], server_ip: &str) -> Self {
        let name = |ns: Option<&NetnsGuard>| ns.map(|ns| ns.name.clone()).unwrap_or_default();
        Self {
            client_ns: name(namespaces.first()),
            server_ns: name(namespaces.last()),
            server_ip: server_ip.into(),
            dial_ip: server_ip.into(),
            keep: Keep::Namespaces { _namespaces: namespaces.into() },
            cgroup: None,
        }
    }

    /// The same pair, its clients dialling `ip` (a ClusterIP) instead of the server's address.
    pub fn dialling(mut self, ip: &str) -> Self {
        self.dial_ip = ip.into();
        self
    }

    /// The cgroup clients must start in (see [`build_socket_lb`]).
    pub fn client_cgroup(&self) -> Option<&TestCgroup> {
        self.cgroup.as_ref()
    }

    /// The node the two pods are on, for a pair built by a CNI plugin.
    pub fn node(&self) -> Option<&Testbed> {
        match &self.keep {
            Keep::Node { node } => Some(node),
            _ => None,
        }
    }

    /// The client's node and the server's, for a pair across two nodes.
    pub fn nodes(&self) -> Option<&[Testbed; 2]> {
        match &self.keep {
            Keep::Nodes { nodes } => Some(nodes),
            _ => None,
        }
    }
}

/// The paths in the order of round `round`: rotated, so every path takes every slot.
pub fn rotated<const N: usize>(paths: [Path; N], round: usize) -> [Path; N] {
    let mut order = paths;
    order.rotate_left(round % N);
    order
}

/// A unique name for this run's namespaces: `ecni-<tag>-<pid>-<n>`.
pub fn unique(tag: &str) -> String {
    format!("ecni-{tag}-{}-{}", std::process::id(), BUILT.fetch_add(1, Ordering::Relaxed))
}

pub fn build(path: Path, ours: &Plugin, family: Family) -> Result<Pair> {
    match path {
        Path::BareVeth => bare_veth(family),
        Path::Loopback => {
            let ns = NetnsGuard::create(&unique("lo"))?;
            let name = ns.name.clone();
            let ip = if family == Family::V6 { "::1" } else { "127.0.0.1" };
            Ok(Pair {
                client_ns: name.clone(),
                server_ns: name,
                server_ip: ip.into(),
                dial_ip: ip.into(),
                keep: Keep::Namespaces { _namespaces: vec![ns] },
                cgroup: None,
            })
        }
        Path::Floor => {
            let pair = pods(path, ours, family, None)?;
            crate::floor::attach(&pair, ours)?;
            Ok(pair)
        }
        _ => pods(path, ours, family, None),
    }
}

/// Two ebpf-cni pods on a node whose node file turns `kubeProxyReplacement` on, its socket
/// LB's programs attached to a cgroup of this run's own (never the machine's root cgroup), in
/// which [`Pair::client_cgroup`] clients start. No Service yet: write them with `service-set`.
pub fn build_socket_lb(ours: &Plugin) -> Result<Pair> {
    let cgroup = TestCgroup::create(&unique("slb"))?;
    let mut pair = pods(Path::EbpfCni, ours, Family::V4, Some(&cgroup))?;
    pair.cgroup = Some(cgroup);
    Ok(pair)
}

/// Two pods on a fresh node, attached by the path's plugin; the second one serves. With
/// `socket_lb`, the node file turns the socket LB on, attached to that cgroup.
fn pods(path: Path, ours: &Plugin, family: Family, socket_lb: Option<&TestCgroup>) -> Result<Pair> {
    let tag = if path.base() == Path::EbpfCni { "bpe" } else { "bpb" };
    let mut tb = Testbed::with_plugin(tag, "10.242.0.0/24", path.plugin(ours))?;
    let conf = path.conf(&tb, family);
    let node_file = match socket_lb {
        Some(cgroup) => Some(node_file(&tb, cgroup)?),
        None => None,
    };
    let env: Vec<(&str, &str)> = node_file.iter().map(|f| ("EBPF_CNI_NODE_CONF", f.as_str())).collect();
    let mut ips = Vec::new();
    for _ in 0..2 {
        let pod = tb.new_pod()?;
        let out = tb.cni_env("ADD", pod, &conf, &tb.pods[pod].netns_path(), &env)?;
        ensure!(out.success, "{} ADD failed: {}", path.name(), out.stdout);
        let result = out.json();
        let address = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str()?.split('/').next())
            .find(|ip| ip.contains(':') == (family == Family::V6))
            .with_context(|| format!("no {family:?} address in {} ADD's result {result}", path.name()))?;
        ips.push(address.to_string());
    }
    if family == Family::V6 {
        // bridge's addresses (the pods' and its gateway's) go through duplicate address
        // detection first; ours skip it. Measure neither while an address is still tentative.
        for pod in &tb.pods {
            settle_ipv6(&pod.netns.name)?;
        }
        settle_ipv6(&tb.node.name)?;
    }
    Ok(Pair {
        client_ns: tb.pods[0].netns.name.clone(),
        server_ns: tb.pods[1].netns.name.clone(),
        server_ip: ips[1].clone(),
        dial_ip: ips[1].clone(),
        keep: Keep::Node { node: Box::new(tb) },
        cgroup: None,
    })
}

/// The node file of a node whose primary network (the testbed's) serves Services itself, its
/// socket LB attached to `cgroup`; its path.
pub fn node_file(tb: &Testbed, cgroup: &TestCgroup) -> Result<String> {
    node_file_with(tb, json!({ "kubeProxyReplacement": true, "cgroupRoot": cgroup.path() }))
}

/// The node file of a node whose primary network is the testbed's (its maps are the ones the
/// agent writes), with the fields of `extra` added; its path. No `ipMasq`: the bench's nodes
/// have no uplink.
pub fn node_file_with(tb: &Testbed, extra: serde_json::Value) -> Result<String> {
    let path = tb.data_dir().with_file_name("node.json");
    let mut node = json!({
        "primaryNetwork": tb.network,
        "podCIDRs": [tb.subnet],
        "bpffsRoot": tb.bpffs_root(),
        "ipamDataDir": tb.data_dir(),
    });
    if let (Some(node), Some(extra)) = (node.as_object_mut(), extra.as_object()) {
        node.extend(extra.clone());
    }
    std::fs::write(&path, node.to_string())?;
    Ok(path.to_string_lossy().into_owned())
}

/// Two namespaces and one veth pair between them, nothing else.
fn bare_veth(family: Family) -> Result<Pair> {
    let base = unique("veth");
    let (a, b) = (NetnsGuard::create(&format!("{base}-a"))?, NetnsGuard::create(&format!("{base}-b"))?);
    let peer_ns = format!("/run/netns/{}", b.name);
    run_in(&a.name, "ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &peer_ns])?;
    let (ips, server) = match family {
        Family::V4 => (["10.243.0.1/24", "10.243.0.2/24"], "10.243.0.2"),
        Family::V6 => (["fd00:10:243::1/64", "fd00:10:243::2/64"], "fd00:10:243::2"),
    };
    for (ns, ip) in [(&a.name, ips[0]), (&b.name, ips[1])] {
        // nodad: usable at once, as ebpf-cni's pod addresses are.
        run_in(ns, "ip", &["addr", "add", ip, "dev", "eth0", "nodad"])?;
        run_in(ns, "ip", &["link", "set", "eth0", "mtu", &MTU.to_string(), "up"])?;
    }
    Ok(Pair {
        client_ns: a.name.clone(),
        server_ns: b.name.clone(),
        server_ip: server.into(),
        dial_ip: server.into(),
        keep: Keep::Namespaces { _namespaces: vec![a, b] },
        cgroup: None,
    })
}

/// Waits (up to 5 s) until no IPv6 address in `netns` is still tentative.
fn settle_ipv6(netns: &str) -> Result<()> {
    for _ in 0..50 {
        let out = run_in(netns, "ip", &["-6", "addr", "show", "tentative"])?;
        if out.stdout.is_empty() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    anyhow::bail!("IPv6 addresses in {netns} still tentative after 5 s")
}
