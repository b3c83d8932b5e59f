//! Two nodes and the outside, as design.md draws them: `<run>-node` holds the pods' host ends,
//! an uplink veth to `<run>-ext` (a server on an address that exists only there, and no route
//! back to any pod, so an unmasqueraded packet cannot be answered) and an underlay veth to the
//! second node. Each node has its pod subnet inside one cluster CIDR, and a route to the other
//! node's subnet via the underlay (host-gw, no overlay). Everything goes with the testbeds.
use anyhow::Result;
use serde_json::json;

use crate::{NetnsGuard, Plugin, Testbed, run_in};

/// The external server's address: only on `ext`'s loopback.
pub const EXT_SERVER: &str = "198.51.100.10";
/// Node 1's uplink address: what masqueraded flows come from.
pub const NODE1_UPLINK_IP: &str = "192.0.2.1";
pub const EXT_UPLINK_IP: &str = "192.0.2.2";
/// Underlay addresses of node 1 and node 2.
pub const UNDERLAY_IPS: [&str; 2] = ["10.254.0.1", "10.254.0.2"];

pub struct Cluster {
    /// Node 1 masquerades (`ipMasq`, uplink and node address left to their defaults); node 2
    /// does not (it has no uplink).
    pub nodes: [Testbed; 2],
    pub ext: NetnsGuard,
}

impl Cluster {
    /// The cluster for test `name`, or `None` when it must be skipped (see [`Testbed::for_test`]).
    pub fn for_test(name: &str, tag: &str, cluster_cidr: &str, subnets: [&str; 2]) -> Option<Self> {
        crate::require_privileges(name)
            .then(|| Self::new(tag, cluster_cidr, subnets).expect("building the test cluster"))
    }

    /// Both nodes run the binary under test (see [`Plugin::from_env`]).
    pub fn new(tag: &str, cluster_cidr: &str, subnets: [&str; 2]) -> Result<Self> {
        Self::with_plugin(tag, cluster_cidr, subnets, Plugin::from_env()?)
    }

    /// Both nodes run `plugin`: the demo and benchmarks bring their own binary, which need not
    /// be the debug build [`Plugin::from_env`] looks for.
    pub fn with_plugin(tag: &str, cluster_cidr: &str, subnets: [&str; 2], plugin: Plugin) -> Result<Self> {
        let mut node1 = Testbed::with_plugin(&format!("{tag}1"), subnets[0], plugin.clone())?;
        let mut node2 = Testbed::with_plugin(&format!("{tag}2"), subnets[1], plugin)?;
        let ext = NetnsGuard::create(&format!("{}-ext", node1.run_id))?;
        let (n1, n2) = (node1.node.name.clone(), node2.node.name.clone());
        veth(&n1, "uplink0", &ext.name, "eth0")?;
        address(&n1, "uplink0", &format!("{NODE1_UPLINK_IP}/24"))?;
        address(&ext.name, "eth0", &format!("{EXT_UPLINK_IP}/24"))?;
        address(&ext.name, "lo", &format!("{EXT_SERVER}/32"))?;
        run_in(&n1, "ip", &["route", "add", "default", "via", EXT_UPLINK_IP])?;
        veth(&n1, "underlay0", &n2, "underlay0")?;
        address(&n1, "underlay0", &format!("{}/24", UNDERLAY_IPS[0]))?;
        address(&n2, "underlay0", &format!("{}/24", UNDERLAY_IPS[1]))?;
        run_in(&n1, "ip", &["route", "add", subnets[1], "via", UNDERLAY_IPS[1]])?;
        run_in(&n2, "ip", &["route", "add", subnets[0], "via", UNDERLAY_IPS[0]])?;
        for node in [&n1, &n2] {
            // What every Kubernetes node has; the plugin itself never changes sysctls.
            run_in(node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        }
        node1.extra.insert("clusterCIDR".into(), json!(cluster_cidr));
        node1.extra.insert("ipMasq".into(), json!(true));
        node2.extra.insert("clusterCIDR".into(), json!(cluster_cidr));
        Ok(Self { nodes: [node1, node2], ext })
    }
}

/// The external server's IPv6 address, node 1's uplink address and the nodes' underlay ones.
pub const EXT_SERVER_V6: &str = "fd00:198:51:100::10";
pub const NODE1_UPLINK_IPV6: &str = "fd00:192:0:2::1";
pub const EXT_UPLINK_IPV6: &str = "fd00:192:0:2::2";
pub const UNDERLAY_IPV6S: [&str; 2] = ["fd00:10:254::1", "fd00:10:254::2"];

impl Cluster {
    /// Makes the cluster dual-stack: IPv6 on the uplink, the outside and the underlay, each
    /// node's IPv6 pod subnet routed via the other's underlay address, and every pod given one
    /// address of each family (`clusterCIDR` gets the IPv6 range after the IPv4 one).
    pub fn add_ipv6(&mut self, cluster_cidr6: &str, subnets6: [&str; 2]) -> Result<()> {
        let (n1, n2) = (self.nodes[0].node.name.clone(), self.nodes[1].node.name.clone());
        address6(&n1, "uplink0", &format!("{NODE1_UPLINK_IPV6}/64"))?;
        address6(&self.ext.name, "eth0", &format!("{EXT_UPLINK_IPV6}/64"))?;
        address6(&self.ext.name, "lo", &format!("{EXT_SERVER_V6}/128"))?;
        address6(&n1, "underlay0", &format!("{}/64", UNDERLAY_IPV6S[0]))?;
        address6(&n2, "underlay0", &format!("{}/64", UNDERLAY_IPV6S[1]))?;
        run_in(&n1, "ip", &["-6", "route", "add", "default", "via", EXT_UPLINK_IPV6])?;
        run_in(&n1, "ip", &["-6", "route", "add", subnets6[1], "via", UNDERLAY_IPV6S[1]])?;
        run_in(&n2, "ip", &["-6", "route", "add", subnets6[0], "via", UNDERLAY_IPV6S[0]])?;
        for (node, subnet6) in self.nodes.iter_mut().zip(subnets6) {
            run_in(&node.node.name, "sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
            let cidrs = format!("{},{cluster_cidr6}", node.extra["clusterCIDR"].as_str().unwrap_or_default());
            node.extra.insert("clusterCIDR".into(), json!(cidrs));
            let ipam = json!({
                "type": "host-local",
                "ranges": [[{ "subnet": node.subnet }], [{ "subnet": subnet6 }]],
                "dataDir": node.data_dir(),
            });
            node.extra.insert("ipam".into(), ipam);
        }
        // A node resolves a forwarded packet's next hop only once the interface's link-local
        // address has passed duplicate address detection (about a second after link up).
        for (ns, dev) in [(&n1, "uplink0"), (&n1, "underlay0"), (&n2, "underlay0"), (&self.ext.name, "eth0")] {
            wait_for_link_local(ns, dev)?;
        }
        Ok(())
    }
}

fn wait_for_link_local(ns: &str, dev: &str) -> Result<()> {
    for _ in 0..100 {
        let ready = run_in(ns, "ip", &["-6", "addr", "show", "dev", dev, "scope", "link", "-tentative"])?;
        if String::from_utf8_lossy(&ready.stdout).contains("fe80::") {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    anyhow::bail!("{dev} in {ns} has no usable link-local address after 5 s")
}

/// A veth pair between two namespaces, both ends up.
fn veth(ns_a: &str, name_a: &str, ns_b: &str, name_b: &str) -> Result<()> {
    let b = format!("/run/netns/{ns_b}");
    run_in(ns_a, "ip", &["link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", &b])?;
    run_in(ns_a, "ip", &["link", "set", name_a, "up"])?;
    run_in(ns_b, "ip", &["link", "set", name_b, "up"])?;
    Ok(())
}

/// Without duplicate address detection, which would hold the address back for a second.
fn address6(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    run_in(ns, "ip", &["-6", "addr", "add", cidr, "dev", dev, "nodad"]).map(drop)
}

fn address(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    run_in(ns, "ip", &["addr", "add", cidr, "dev", dev]).map(drop)
}
