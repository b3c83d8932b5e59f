//! Issue 17's topology: two nodes with ONE NIC each (`eth0`: default route, masquerade uplink
//! and cross-node path all on it) on a shared LAN, a Linux bridge inside `<run>-lan`. On the same
//! LAN: `ext`, the router to the "internet" (a server on an address that exists only on its
//! loopback, and no route to any pod, so an unmasqueraded packet cannot be answered), and `host`,
//! a machine outside the cluster (a control-plane host, say) with a route to each node's pod
//! subnet via that node. Each node routes the other's pod subnet via its LAN address (host-gw)
//! and forwards; pods get `ipMasq` with `clusterCIDR` covering both subnets, uplink and node
//! address left to their defaults.
//!
//! With [`Ipv6Plan`] ([`Lan::for_test_dual_stack`]) the LAN is dual-stack: IPv6 addresses on
//! the LAN (no duplicate address detection, which holds an address back for a second, on the
//! LAN's links, their link-local addresses included), an IPv6 pod subnet per node
//! inside an IPv6 cluster CIDR, the same host-gw routes and the host's routes for IPv6, IPv6
//! forwarding on the nodes, and each pod one address of each family.
//!
//! The pods are networked by ebpf-cni, or, to check the tests themselves, by the reference
//! `bridge` plugin (see [`PodNetwork`]). Both chain the reference `portmap`. Everything is in
//! namespaces this run created and goes with them on drop, pass or fail.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::{
    EXT_SERVER, NetnsGuard, Plugin, TEST_MTU, Testbed, run_in,
    runtime::{NetworkList, Runtime},
};

/// `ext`'s LAN address: the nodes' default gateway.
pub const LAN_ROUTER: &str = "192.0.2.1";
/// Node 1's and node 2's LAN (and only) addresses.
pub const LAN_NODE_IPS: [&str; 2] = ["192.0.2.11", "192.0.2.12"];
/// The machine outside the cluster.
pub const LAN_HOST: &str = "192.0.2.100";
/// `ext`'s, the nodes' and the host's IPv6 addresses on the LAN (`LAN_IPV6_PREFIX`), with the
/// IPv4 ones' last digits.
pub const LAN_ROUTER_V6: &str = "fd00:192:0:2::1";
pub const LAN_NODE_IPV6S: [&str; 2] = ["fd00:192:0:2::11", "fd00:192:0:2::12"];
pub const LAN_HOST_V6: &str = "fd00:192:0:2::100";
const LAN_IPV6_PREFIX: u8 = 64;
/// The LAN bridge's port toward each node, in the `lan` namespace (where a sniffer listens).
pub const LAN_NODE_PORTS: [&str; 2] = ["node1", "node2"];

/// What networks the pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodNetwork {
    /// The binary under test.
    EbpfCni,
    /// The reference `bridge` + `host-local` (`isGateway`, hairpin, br_netfilter on), with the
    /// masquerade ebpf-cni's `ipMasq` + `clusterCIDR` means written as one iptables rule
    /// (bridge's own `ipMasq` would masquerade traffic to the other node's pods too).
    Bridge,
}

impl PodNetwork {
    /// `EBPF_CNI_TESTS_POD_NETWORK=bridge` runs a suite against the reference plugin instead.
    pub fn from_env() -> Self {
        match std::env::var("EBPF_CNI_TESTS_POD_NETWORK").as_deref() {
            Ok("bridge") => Self::Bridge,
            _ => Self::EbpfCni,
        }
    }
}

/// The IPv6 side of a dual-stack LAN: the cluster CIDR (after the IPv4 one in `clusterCIDR`)
/// and each node's pod subnet inside it.
#[derive(Clone, Copy, Debug)]
pub struct Ipv6Plan<'a> {
    pub cluster_cidr: &'a str,
    pub subnets: [&'a str; 2],
}

/// A pod after ADD: its namespace and addresses (IPv6 on a dual-stack LAN).
#[derive(Clone, Debug)]
pub struct LanPod {
    pub netns: String,
    pub ip: Ipv4Addr,
    pub ip6: Option<Ipv6Addr>,
}

/// Fields drop in order: the nodes (pods, node, bpffs), then the LAN's other members, then the
/// LAN itself.
pub struct Lan {
    pub nodes: [Testbed; 2],
    pub ext: NetnsGuard,
    pub host: NetnsGuard,
    pub lan: NetnsGuard,
    pub pod_network: PodNetwork,
    runtimes: [Runtime; 2],
    lists: [NetworkList; 2],
}

impl Lan {
    /// The LAN for test `name`, or `None` when it must be skipped (see [`Testbed::for_test`]).
    pub fn for_test(name: &str, tag: &str, cluster_cidr: &str, subnets: [&str; 2]) -> Option<Self> {
        crate::require_privileges(name).then(|| {
            Self::new(tag, PodNetwork::from_env(), cluster_cidr, subnets, None).expect("building the LAN topology")
        })
    }

    /// Like [`Self::for_test`], dual-stack.
    pub fn for_test_dual_stack(
        name: &str,
        tag: &str,
        cluster_cidr: &str,
        subnets: [&str; 2],
        ipv6: Ipv6Plan,
    ) -> Option<Self> {
        crate::require_privileges(name).then(|| {
            Self::new(tag, PodNetwork::from_env(), cluster_cidr, subnets, Some(ipv6))
                .expect("building the dual-stack LAN topology")
        })
    }

    pub fn new(
        tag: &str,
        pod_network: PodNetwork,
        cluster_cidr: &str,
        subnets: [&str; 2],
        ipv6: Option<Ipv6Plan>,
    ) -> Result<Self> {
        Self::with_plugin(tag, pod_network, cluster_cidr, subnets, ipv6, Plugin::from_env()?)
    }

    /// Like [`Self::new`] with the binary `plugin` (the benchmarks bring their own).
    pub fn with_plugin(
        tag: &str,
        pod_network: PodNetwork,
        cluster_cidr: &str,
        subnets: [&str; 2],
        ipv6: Option<Ipv6Plan>,
        plugin: Plugin,
    ) -> Result<Self> {
        let mut nodes = [
            Testbed::with_plugin(&format!("{tag}1"), subnets[0], plugin.clone())?,
            Testbed::with_plugin(&format!("{tag}2"), subnets[1], plugin)?,
        ];
        let run_id = nodes[0].run_id.clone();
        let ext = NetnsGuard::create(&format!("{run_id}-ext"))?;
        let host = NetnsGuard::create(&format!("{run_id}-host"))?;
        let lan = NetnsGuard::create(&format!("{run_id}-lan"))?;
        run_in(&lan.name, "ip", &["link", "add", "lan0", "type", "bridge"])?;
        run_in(&lan.name, "ip", &["link", "set", "lan0", "up"])?;
        // A plain switch: its frames never go through this namespace's netfilter.
        let _ = run_in(&lan.name, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=0"]);
        let (n1, n2) = (nodes[0].node.name.clone(), nodes[1].node.name.clone());
        join(&lan.name, LAN_NODE_PORTS[0], &n1, &format!("{}/24", LAN_NODE_IPS[0]))?;
        join(&lan.name, LAN_NODE_PORTS[1], &n2, &format!("{}/24", LAN_NODE_IPS[1]))?;
        join(&lan.name, "ext", &ext.name, &format!("{LAN_ROUTER}/24"))?;
        join(&lan.name, "host", &host.name, &format!("{LAN_HOST}/24"))?;
        run_in(&ext.name, "ip", &["addr", "add", &format!("{EXT_SERVER}/32"), "dev", "lo"])?;
        for (i, node) in [&n1, &n2].into_iter().enumerate() {
            let other = 1 - i;
            run_in(node, "ip", &["route", "add", "default", "via", LAN_ROUTER])?;
            run_in(node, "ip", &["route", "add", subnets[other], "via", LAN_NODE_IPS[other]])?;
            // What every Kubernetes node has; the plugin itself never changes sysctls.
            run_in(node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
            run_in(&host.name, "ip", &["route", "add", subnets[i], "via", LAN_NODE_IPS[i]])?;
        }
        if let Some(plan) = ipv6 {
            add_ipv6(&nodes, &ext.name, &host.name, plan)?;
        }
        for (node, i) in nodes.iter_mut().zip(0..) {
            let cidrs = match ipv6 {
                Some(plan) => format!("{cluster_cidr},{}", plan.cluster_cidr),
                None => cluster_cidr.to_string(),
            };
            node.extra.insert("clusterCIDR".into(), json!(cidrs));
            node.extra.insert("ipMasq".into(), json!(true));
            if let Some(plan) = ipv6 {
                let ipam = json!({
                    "type": "host-local",
                    "ranges": [[{ "subnet": node.subnet }], [{ "subnet": plan.subnets[i] }]],
                    "dataDir": node.data_dir(),
                });
                node.extra.insert("ipam".into(), ipam);
            }
            if pod_network == PodNetwork::Bridge {
                reference_node_setup(node, cluster_cidr)?;
            }
        }
        let runtimes = [Runtime::for_testbed(&nodes[0]), Runtime::for_testbed(&nodes[1])];
        let lists = [
            runtimes[0].load(&conflist(&nodes[0], pod_network))?,
            runtimes[1].load(&conflist(&nodes[1], pod_network))?,
        ];
        Ok(Self { nodes, ext, host, lan, pod_network, runtimes, lists })
    }

    /// A new pod on `node` (0 or 1), ADDed through the node's conflist.
    pub fn add_pod(&mut self, node: usize) -> Result<LanPod> {
        self.add_pod_with_port_mappings(node, json!([]))
    }

    /// Like [`Self::add_pod`], with the `CNI_ARGS` kubelet sends for pod `namespace`/`name`.
    pub fn add_k8s_pod(&mut self, node: usize, namespace: &str, name: &str) -> Result<LanPod> {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
        self.add_pod_with(node, json!([]), args)
    }

    /// A new pod on `node` whose `host_port` (TCP) leads to its `container_port`, by portmap.
    pub fn add_pod_with_host_port(&mut self, node: usize, host_port: u16, container_port: u16) -> Result<LanPod> {
        let mapping = json!([{ "hostPort": host_port, "containerPort": container_port, "protocol": "tcp" }]);
        self.add_pod_with_port_mappings(node, mapping)
    }

    fn add_pod_with_port_mappings(&mut self, node: usize, mappings: Value) -> Result<LanPod> {
        self.add_pod_with(node, mappings, String::new())
    }

    fn add_pod_with(&mut self, node: usize, mappings: Value, cni_args: String) -> Result<LanPod> {
        let tb = &mut self.nodes[node];
        let pod = tb.new_pod()?;
        let mut sandbox = tb.sandbox(pod);
        sandbox.cni_args = cni_args;
        sandbox.capability_args.insert("portMappings".into(), mappings);
        let result = self.runtimes[node].add(&self.lists[node], &sandbox)?;
        let mut addresses = Vec::new();
        for ip in result["ips"].as_array().context("no addresses in the ADD result")? {
            let address = ip["address"].as_str().context("an IP without an address")?;
            addresses.push(address.split('/').next().unwrap_or_default().parse::<IpAddr>()?);
        }
        let ip = addresses.iter().find_map(|a| if let IpAddr::V4(a) = a { Some(*a) } else { None });
        let ip6 = addresses.iter().find_map(|a| if let IpAddr::V6(a) = a { Some(*a) } else { None });
        let ip = ip.context("no IPv4 address in the ADD result")?;
        Ok(LanPod { netns: tb.pods[pod].netns.name.clone(), ip, ip6 })
    }

    /// `node`'s plugins read the node file at `path` from the next call on.
    pub fn use_node_conf(&mut self, node: usize, path: &std::path::Path) {
        self.runtimes[node].use_node_conf(path);
    }

    /// Every node runs `plugin` from the next call on, for every verb and for `service-set`: an
    /// upgrade of the binary (or a rollback), the nodes' pins and pods left as they are.
    pub fn use_plugin(&mut self, plugin: &Plugin) {
        for (node, runtime) in self.nodes.iter_mut().zip(&mut self.runtimes) {
            node.plugin = plugin.clone();
            runtime.search_first(plugin.dir());
        }
    }

    /// Gives `node` a node file whose primary network serves Services itself
    /// (`kubeProxyReplacement`), its programs in `cgroup` (the test's own, never the machine's
    /// root), masquerading, with the cluster range(s) `cluster_cidr` (IPv4, then IPv6 after a
    /// comma) and its pod CIDRs: its subnet and `pods6` for a dual-stack LAN. Returns its path.
    pub fn use_kube_proxy_replacement(
        &mut self,
        node: usize,
        cgroup: &crate::cgroup::TestCgroup,
        cluster_cidr: &str,
        pods6: Option<&str>,
    ) -> std::path::PathBuf {
        let tb = &self.nodes[node];
        let path = tb.data_dir().with_file_name("node.json");
        let pod_cidrs: Vec<&str> = std::iter::once(tb.subnet.as_str()).chain(pods6).collect();
        let conf = json!({
            "primaryNetwork": tb.network, "ipMasq": true, "clusterCIDR": cluster_cidr, "podCIDRs": pod_cidrs,
            "bpffsRoot": tb.bpffs_root(), "ipamDataDir": tb.data_dir(),
            "kubeProxyReplacement": true, "cgroupRoot": cgroup.path(),
        });
        std::fs::write(&path, conf.to_string()).expect("writing the node file");
        self.use_node_conf(node, &path);
        path
    }

    /// `ebpf-cni service-set` on `node`'s network, the test-only writer of the socket LB's maps
    /// (the agent's, without the API server): `frontend`'s backends, `extra` further flags (such
    /// as `--remove`); the command's JSON (what settling did: `reconnected`, `destroyed`,
    /// `lan_flows`).
    pub fn service_set(
        &self,
        node: usize,
        frontend: &str,
        protocol: &str,
        backends: &[String],
        extra: &[&str],
    ) -> Value {
        let tb = &self.nodes[node];
        let mut command = std::process::Command::new(&tb.plugin.binary);
        command.args(["service-set", "--network", &tb.network, "--bpffs-root"]).arg(tb.bpffs_root());
        command.args(["--frontend", frontend, "--protocol", protocol]).args(extra);
        for backend in backends {
            command.args(["--backend", backend]);
        }
        let out = command.output().expect("running service-set");
        assert!(out.status.success(), "service-set {frontend}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("service-set's JSON")
    }

    /// DEL of pod number `pod` of `node` through the node's conflist.
    pub fn del_pod(&self, node: usize, pod: usize) -> Result<()> {
        self.runtimes[node].del(&self.lists[node], &self.nodes[node].sandbox(pod))
    }

    /// The MAC address of `node`'s eth0: what its frames on the LAN come from.
    pub fn node_mac(&self, node: usize) -> Result<[u8; 6]> {
        link_mac(&self.nodes[node].node.name, "eth0")
    }
}

/// The LAN's IPv6 side (see the module's doc), once the IPv4 one is up.
fn add_ipv6(nodes: &[Testbed; 2], ext: &str, host: &str, plan: Ipv6Plan) -> Result<()> {
    address6(ext, LAN_ROUTER_V6)?;
    address6(host, LAN_HOST_V6)?;
    for (i, node) in nodes.iter().enumerate() {
        let (ns, other) = (&node.node.name, 1 - i);
        address6(ns, LAN_NODE_IPV6S[i])?;
        // As for IPv4: a node's own packets to a ClusterIP need a route before its OUTPUT DNAT.
        run_in(ns, "ip", &["-6", "route", "add", "default", "via", LAN_ROUTER_V6])?;
        run_in(ns, "ip", &["-6", "route", "add", plan.subnets[other], "via", LAN_NODE_IPV6S[other]])?;
        run_in(ns, "sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
        run_in(host, "ip", &["-6", "route", "add", plan.subnets[i], "via", LAN_NODE_IPV6S[i]])?;
    }
    Ok(())
}

/// `ip` on `ns`'s eth0, usable at once (no duplicate address detection).
fn address6(ns: &str, ip: &str) -> Result<()> {
    let cidr = format!("{ip}/{LAN_IPV6_PREFIX}");
    run_in(ns, "ip", &["-6", "addr", "add", &cidr, "dev", "eth0", "nodad"]).map(drop)
}

/// A veth from the LAN bridge (`port`, in `lan`) to `eth0` in `ns`, with `cidr` on `eth0`.
fn join(lan: &str, port: &str, ns: &str, cidr: &str) -> Result<()> {
    let peer = format!("/run/netns/{ns}");
    run_in(lan, "ip", &["link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &peer])?;
    run_in(lan, "ip", &["link", "set", port, "master", "lan0", "up"])?;
    // No duplicate address detection on eth0's link-local address either: while it is
    // tentative, the kernel sends no neighbour solicitation for a packet it forwards (the source
    // is not its own), so a pod's first IPv6 packet to the other node would wait a second.
    run_in(ns, "sysctl", &["-qw", "net.ipv6.conf.eth0.accept_dad=0"])?;
    run_in(ns, "ip", &["link", "set", "eth0", "up"])?;
    run_in(ns, "ip", &["addr", "add", cidr, "dev", "eth0"])?;
    Ok(())
}

/// The node's conflist: ebpf-cni or the reference bridge, then portmap. The bridge's IPAM is
/// ebpf-cni's (both range sets on a dual-stack LAN), with a default route per family.
fn conflist(node: &Testbed, pod_network: PodNetwork) -> Value {
    let portmap = json!({ "type": "portmap", "capabilities": { "portMappings": true } });
    let mut ipam = node.conf("1.0.0")["ipam"].clone();
    ipam["routes"] = match ipam.get("ranges").and_then(Value::as_array).map(Vec::len) {
        Some(2) => json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]),
        _ => json!([{ "dst": "0.0.0.0/0" }]),
    };
    match pod_network {
        PodNetwork::EbpfCni => node.conflist("1.0.0", vec![portmap]),
        PodNetwork::Bridge => json!({
            "cniVersion": "1.0.0",
            "name": node.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "hairpinMode": true,
                    "mtu": TEST_MTU,
                    "ipam": ipam,
                },
                portmap,
            ],
        }),
    }
}

/// What a node needs around the reference bridge: bridged pod-to-pod packets through
/// netfilter, both families (kube-proxy's requirement, so a same-node endpoint's reply is
/// un-DNATed), and pods masqueraded toward anything outside the cluster (and not the node
/// itself; IPv4 only, as ebpf-cni's masquerade is so far).
fn reference_node_setup(node: &Testbed, cluster_cidr: &str) -> Result<()> {
    let ns = &node.node.name;
    run_in(ns, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
    run_in(ns, "sysctl", &["-qw", "net.bridge.bridge-nf-call-ip6tables=1"])?;
    // `cni0` is made at the first ADD, not long before as on a real node: without DAD its
    // link-local address is usable at once, or the node would send no neighbour solicitation
    // for a packet it forwards into the bridge for a second (see `join`).
    run_in(ns, "sysctl", &["-qw", "net.ipv6.conf.default.accept_dad=0"])?;
    let rule = [
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-s",
        &node.subnet,
        "!",
        "-d",
        cluster_cidr,
        "-m",
        "addrtype",
        "!",
        "--dst-type",
        "LOCAL",
        "-m",
        "comment",
        "--comment",
        "ipMasq with clusterCIDR",
        "-j",
        "MASQUERADE",
    ];
    run_in(ns, "iptables", &rule).map(drop)
}

/// `ip:port` as `service-set` takes it (`[ip6]:port` for IPv6).
pub fn at(ip: impl std::fmt::Display, port: u16) -> String {
    std::net::SocketAddr::new(ip.to_string().parse().expect("an IP address"), port).to_string()
}

/// The MAC address of link `ifname` in namespace `netns`.
pub fn link_mac(netns: &str, ifname: &str) -> Result<[u8; 6]> {
    let out = run_in(netns, "ip", &["-j", "link", "show", "dev", ifname])?;
    let links: Value = serde_json::from_slice(&out.stdout)?;
    let text = links[0]["address"].as_str().with_context(|| format!("{ifname} without a MAC"))?;
    let bytes: Vec<u8> = text.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("MAC of the wrong length: {text}"))
}
