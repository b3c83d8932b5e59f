//! The paths a pod→pod figure is measured on, each built fresh in namespaces of its own and
//! removed when dropped: two pods of one node attached by ebpf-cni or by bridge, two namespaces
//! joined by a bare veth pair (the ceiling for any veth-based path), and loopback in one
//! namespace (the ceiling of the TCP/IP stack alone).
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, ensure};
use ebpf_cni_tests::{NetnsGuard, Plugin, Testbed, run_in};
use serde_json::{Value, json};

/// Every path runs at this MTU (the veth default), so none wins by packet size.
pub const MTU: u32 = 1500;

static BUILT: AtomicU32 = AtomicU32::new(0);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path {
    EbpfCni,
    Bridge,
    BareVeth,
    Loopback,
}

impl Path {
    pub const ALL: [Self; 4] = [Self::EbpfCni, Self::Bridge, Self::BareVeth, Self::Loopback];
    pub const PLUGINS: [Self; 2] = [Self::EbpfCni, Self::Bridge];

    pub fn name(self) -> &'static str {
        match self {
            Self::EbpfCni => "ebpf-cni",
            Self::Bridge => "bridge",
            Self::BareVeth => "bare veth",
            Self::Loopback => "loopback",
        }
    }

    /// The plugin binary of a CNI path.
    pub fn plugin(self, ours: &Plugin) -> Plugin {
        match self {
            Self::Bridge => Plugin { binary: "/usr/lib/cni/bridge".into() },
            _ => ours.clone(),
        }
    }

    /// The network configuration of a CNI path: ours as the testbed writes it, or bridge as a
    /// node operator sets it up (gateway and pods' default route on the bridge, ipMasq, the
    /// same host-local pool); both at [`MTU`].
    pub fn conf(self, tb: &Testbed) -> Value {
        let mut conf = match self {
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
}

/// What the pair holds, removed when it is dropped.
enum Keep {
    Node {
        node: Box<Testbed>,
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
        }
    }

    /// The same pair, its clients dialling `ip` (a ClusterIP) instead of the server's address.
    pub fn dialling(mut self, ip: &str) -> Self {
        self.dial_ip = ip.into();
        self
    }

    /// The node the two pods are on, for a pair built by a CNI plugin.
    pub fn node(&self) -> Option<&Testbed> {
        match &self.keep {
            Keep::Node { node } => Some(node),
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

pub fn build(path: Path, ours: &Plugin) -> Result<Pair> {
    match path {
        Path::EbpfCni | Path::Bridge => pods(path, ours),
        Path::BareVeth => bare_veth(),
        Path::Loopback => {
            let ns = NetnsGuard::create(&unique("lo"))?;
            let name = ns.name.clone();
            Ok(Pair {
                client_ns: name.clone(),
                server_ns: name,
                server_ip: "127.0.0.1".into(),
                dial_ip: "127.0.0.1".into(),
                keep: Keep::Namespaces { _namespaces: vec![ns] },
            })
        }
    }
}

/// Two pods on a fresh node, attached by the path's plugin; the second one serves.
fn pods(path: Path, ours: &Plugin) -> Result<Pair> {
    let tag = if path == Path::EbpfCni { "bpe" } else { "bpb" };
    let mut tb = Testbed::with_plugin(tag, "10.242.0.0/24", path.plugin(ours))?;
    let conf = path.conf(&tb);
    let mut ips = Vec::new();
    for _ in 0..2 {
        let pod = tb.new_pod()?;
        let out = tb.cni("ADD", pod, &conf)?;
        ensure!(out.success, "{} ADD failed: {}", path.name(), out.stdout);
        let ip = out.json()["ips"][0]["address"].as_str().context("no address in the result")?.to_string();
        ips.push(ip.split('/').next().unwrap_or_default().to_string());
    }
    Ok(Pair {
        client_ns: tb.pods[0].netns.name.clone(),
        server_ns: tb.pods[1].netns.name.clone(),
        server_ip: ips[1].clone(),
        dial_ip: ips[1].clone(),
        keep: Keep::Node { node: Box::new(tb) },
    })
}

/// Two namespaces and one veth pair between them, nothing else.
fn bare_veth() -> Result<Pair> {
    let base = unique("veth");
    let (a, b) = (NetnsGuard::create(&format!("{base}-a"))?, NetnsGuard::create(&format!("{base}-b"))?);
    let peer_ns = format!("/run/netns/{}", b.name);
    run_in(&a.name, "ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &peer_ns])?;
    for (ns, ip) in [(&a.name, "10.243.0.1/24"), (&b.name, "10.243.0.2/24")] {
        run_in(ns, "ip", &["addr", "add", ip, "dev", "eth0"])?;
        run_in(ns, "ip", &["link", "set", "eth0", "mtu", &MTU.to_string(), "up"])?;
    }
    Ok(Pair {
        client_ns: a.name.clone(),
        server_ns: b.name.clone(),
        server_ip: "10.243.0.2".into(),
        dial_ip: "10.243.0.2".into(),
        keep: Keep::Namespaces { _namespaces: vec![a, b] },
    })
}
