//! The cross-node paths, each built fresh: two "node" namespaces joined by one veth, the wire
//! (`eth0` in each, the node's only NIC), each node's pod subnet inside one cluster CIDR and a
//! route to the other node's via the other's wire address (host-gw: what ebpf-cni's agent,
//! flannel's host-gw backend and kubenet write). The client is a pod of node 1, the server a
//! pod of node 2.
//!
//! - ebpf-cni: `ipMasq` with the cluster CIDR and the wire as uplink, as on a single-NIC node:
//!   `from_pod` sends a packet for the other node's pod straight out of the wire (FIB lookup,
//!   redirect), and the other node's `from_uplink` straight into its pod.
//! - bridge, as flannel's host-gw and kubenet run it: `cni0` and a host-local pool of the
//!   node's subnet, no `ipMasq` in the plugin's configuration; the node masquerades what leaves
//!   the cluster by one iptables rule (flannel's `--ip-masq`, kubenet's non-masquerade CIDR),
//!   which cluster traffic never matches, and bridged packets go through netfilter
//!   (`bridge-nf-call-iptables`, kube-proxy's requirement): the reference nodes of `lan.rs`.
//! - bare node → node: two namespaces and the same wire, nothing else (the ceiling).
//! - routed (1 hop, no plugin): a client and a server namespace, each joined by one veth to a
//!   third that forwards between them (`ip_forward`, nothing else: no netfilter rule, no BPF,
//!   no bridge), each with an address in its own node's pod subnet and a default route via the
//!   router. A pod's packet across nodes crosses two veths (pod → node, then the wire) where
//!   the bare wire has one; this path crosses two veths and one kernel forwarding hop and no
//!   plugin, the cost of the structure alone.
use anyhow::{Context, Result, bail, ensure};
use ebpf_cni_tests::{NetnsGuard, Plugin, Testbed, run_in};
use serde_json::{Value, json};

use crate::topology::{MTU, Pair, Path, unique};

const CLUSTER_CIDR: &str = "10.240.0.0/16";
const SUBNETS: [&str; 2] = ["10.240.1.0/24", "10.240.2.0/24"];
/// Node 1's and node 2's addresses on the wire.
const WIRE_IPS: [&str; 2] = ["10.254.0.1", "10.254.0.2"];
const WIRE: &str = "eth0";
/// The routed path's router and client, then its router and server: the nodes' pod subnets.
const ROUTED_IPS: [[&str; 2]; 2] = [["10.240.1.1", "10.240.1.2"], ["10.240.2.1", "10.240.2.2"]];

pub fn build(path: Path, ours: &Plugin) -> Result<Pair> {
    match path {
        Path::BareNodes => bare(),
        Path::Routed => routed(),
        Path::EbpfCni | Path::Bridge => pods(path, ours),
        other => bail!("{} is no cross-node path", other.name()),
    }
}

fn bare() -> Result<Pair> {
    let base = unique("xnb");
    let nodes = [NetnsGuard::create(&format!("{base}-n1"))?, NetnsGuard::create(&format!("{base}-n2"))?];
    wire(&nodes[0].name, &nodes[1].name)?;
    Ok(Pair::owning(nodes, WIRE_IPS[1]))
}

/// Client —veth— router —veth— server. Each link is `eth0` on the client's or server's side;
/// on the router's, `eth0` to the client and `eth1` to the server.
fn routed() -> Result<Pair> {
    let base = unique("xnh");
    let client = NetnsGuard::create(&format!("{base}-c"))?;
    let router = NetnsGuard::create(&format!("{base}-r"))?;
    let server = NetnsGuard::create(&format!("{base}-s"))?;
    run_in(&router.name, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    for (end, router_side, [gateway, host]) in [(&client, "eth0", ROUTED_IPS[0]), (&server, "eth1", ROUTED_IPS[1])] {
        let peer = format!("/run/netns/{}", end.name);
        run_in(
            &router.name,
            "ip",
            &["link", "add", router_side, "type", "veth", "peer", "name", WIRE, "netns", &peer],
        )?;
        for (ns, dev, ip) in [(&router.name, router_side, gateway), (&end.name, WIRE, host)] {
            run_in(ns, "ip", &["addr", "add", &format!("{ip}/24"), "dev", dev])?;
            run_in(ns, "ip", &["link", "set", dev, "mtu", &MTU.to_string(), "up"])?;
        }
        run_in(&end.name, "ip", &["route", "add", "default", "via", gateway])?;
    }
    Ok(Pair::owning([client, router, server], ROUTED_IPS[1][1]))
}

/// A pod on each node, attached by the path's plugin.
fn pods(path: Path, ours: &Plugin) -> Result<Pair> {
    let tag = if path == Path::EbpfCni { "xne" } else { "xnr" };
    let plugin = path.plugin(ours);
    let mut nodes = [
        Testbed::with_plugin(&format!("{tag}1"), SUBNETS[0], plugin.clone())?,
        Testbed::with_plugin(&format!("{tag}2"), SUBNETS[1], plugin)?,
    ];
    wire(&nodes[0].node.name, &nodes[1].node.name)?;
    for (i, node) in nodes.iter().enumerate() {
        let (ns, other) = (&node.node.name, 1 - i);
        run_in(ns, "ip", &["route", "add", SUBNETS[other], "via", WIRE_IPS[other]])?;
        // What every Kubernetes node has; the plugin itself never changes sysctls.
        run_in(ns, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        if path == Path::Bridge {
            reference_node(ns, &node.subnet)?;
        }
    }
    let mut ips = Vec::new();
    for node in &mut nodes {
        let pod = node.new_pod()?;
        let conf = conf(path, node);
        let out = node.cni("ADD", pod, &conf)?;
        ensure!(out.success, "{} ADD failed: {}", path.name(), out.stdout);
        let result = out.json();
        let address = result["ips"][0]["address"].as_str().and_then(|a| a.split('/').next());
        ips.push(address.with_context(|| format!("no address in {} ADD's result {result}", path.name()))?.to_string());
    }
    Ok(Pair::across(nodes, &ips[1]))
}

/// `eth0` in each namespace, one veth, at [`MTU`], with the nodes' wire addresses.
fn wire(node1: &str, node2: &str) -> Result<()> {
    let peer = format!("/run/netns/{node2}");
    run_in(node1, "ip", &["link", "add", WIRE, "type", "veth", "peer", "name", WIRE, "netns", &peer])?;
    for (ns, ip) in [(node1, WIRE_IPS[0]), (node2, WIRE_IPS[1])] {
        run_in(ns, "ip", &["addr", "add", &format!("{ip}/24"), "dev", WIRE])?;
        run_in(ns, "ip", &["link", "set", WIRE, "mtu", &MTU.to_string(), "up"])?;
    }
    Ok(())
}

fn conf(path: Path, node: &mut Testbed) -> Value {
    let mut conf = match path {
        Path::Bridge => json!({
            "cniVersion": "1.0.0",
            "name": node.network,
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "isDefaultGateway": true,
            "ipam": { "type": "host-local", "subnet": node.subnet, "dataDir": node.data_dir() },
        }),
        _ => {
            node.extra.insert("clusterCIDR".into(), json!(CLUSTER_CIDR));
            node.extra.insert("ipMasq".into(), json!(true));
            node.extra.insert("uplink".into(), json!(WIRE));
            node.conf("1.0.0")
        }
    };
    conf["mtu"] = json!(MTU);
    conf
}

/// Bridged packets through netfilter, and the node's masquerade of what leaves the cluster.
fn reference_node(ns: &str, subnet: &str) -> Result<()> {
    run_in(ns, "sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
    let rule = ["-t", "nat", "-A", "POSTROUTING", "-s", subnet, "!", "-d", CLUSTER_CIDR, "-j", "MASQUERADE"];
    run_in(ns, "iptables", &rule).map(drop)
}
