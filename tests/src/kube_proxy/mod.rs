//! The rules kube-proxy writes for a set of Services, written by the test into a node namespace
//! it created, in kube-proxy's two Linux modes:
//!
//! - [`Flavour::Iptables`]: what `iptables-restore --noflush` receives from the iptables proxier
//!   (through iptables-nft here; `ip6tables-restore` for IPv6): nat `KUBE-SERVICES` →
//!   `KUBE-SVC-*` → `KUBE-SEP-*` (DNAT), `KUBE-NODEPORTS` → `KUBE-EXT-*`, `KUBE-MARK-MASQ` and
//!   `KUBE-POSTROUTING` (`MASQUERADE --random-fully` of packets marked 0x4000), and filter
//!   `KUBE-FORWARD` with `-m conntrack --ctstate INVALID -j DROP` before its mark and
//!   ESTABLISHED accepts (`iptables.rs`).
//! - [`Flavour::Nftables`]: the `ip kube-proxy` (IPv4) and `ip6 kube-proxy` (IPv6) tables of the
//!   nftables proxier: base chains hooked just before DNAT, `services` dispatching through the
//!   `service-ips` / `service-nodeports` verdict maps (NodePorts by `fib daddr type local`),
//!   `service-*`, `external-*` and `endpoint-*` chains, the masquerade mark, and `ct state
//!   invalid drop` in `forward` (`nftables.rs`).
//!
//! Both as kube-proxy runs by default: `clusterCIDR` set (so traffic from outside the cluster to
//! a ClusterIP is masqueraded), Cluster traffic policies, no session affinity, NodePorts on every
//! local address but loopback, `nf_conntrack_tcp_be_liberal` off (so the INVALID drop is
//! there). The text is our own, shaped after kubernetes' pkg/proxy/{iptables,nftables}.
mod iptables;
mod nftables;

use std::{
    io::Write,
    net::{IpAddr, SocketAddr},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// kube-proxy's default masquerade bit (`--iptables-masquerade-bit=14`).
const MASQ_MARK: &str = "0x4000";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// `--proxy-mode=iptables` (the rules through iptables-nft).
    Iptables,
    /// `--proxy-mode=nftables`.
    Nftables,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// An IP family: kube-proxy runs one proxier per family, each writing the same rules in its
/// own tables, spelled for its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    fn of_cidr(cidr: &str) -> Self {
        if cidr.contains(':') { Self::V6 } else { Self::V4 }
    }

    /// The prefix length of one address.
    fn host_bits(self) -> u8 {
        if self == Self::V4 { 32 } else { 128 }
    }

    /// What NodePorts are never open on, in iptables' syntax.
    fn loopback(self) -> &'static str {
        if self == Self::V4 { "127.0.0.0/8" } else { "::1/128" }
    }

    fn nft_loopback(self) -> &'static str {
        if self == Self::V4 { "127.0.0.0/8" } else { "::1" }
    }

    fn iptables_restore(self) -> &'static str {
        if self == Self::V4 { "iptables-restore" } else { "ip6tables-restore" }
    }

    /// The nftables family of the table, which also matches addresses (`ip daddr`, `ip6 daddr`).
    fn nft(self) -> &'static str {
        if self == Self::V4 { "ip" } else { "ip6" }
    }

    fn nft_addr_type(self) -> &'static str {
        if self == Self::V4 { "ipv4_addr" } else { "ipv6_addr" }
    }
}

/// One service port, as kube-proxy sees it: `namespace/name:port`, its ClusterIP and port, an
/// optional NodePort, and its ready endpoints (in any node, or outside the cluster), all of
/// the ClusterIP's family (a dual-stack Service is two of these, one per family).
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    pub protocol: Protocol,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub node_port: Option<u16>,
    pub endpoints: Vec<SocketAddr>,
}

impl Service {
    /// `name` is `namespace/service:port-name`, as kube-proxy's comments print it.
    pub fn new<E: Into<SocketAddr> + Copy>(
        name: &str,
        protocol: Protocol,
        cluster_ip: impl Into<SocketAddr>,
        endpoints: &[E],
    ) -> Self {
        let cluster_ip = cluster_ip.into();
        let endpoints: Vec<SocketAddr> = endpoints.iter().map(|&e| e.into()).collect();
        assert!(
            endpoints.iter().all(|e| e.is_ipv4() == cluster_ip.is_ipv4()),
            "{name}: endpoints of another family than its ClusterIP {cluster_ip}"
        );
        Self {
            name: name.to_string(),
            protocol,
            cluster_ip: cluster_ip.ip(),
            port: cluster_ip.port(),
            node_port: None,
            endpoints,
        }
    }

    pub fn with_node_port(mut self, node_port: u16) -> Self {
        self.node_port = Some(node_port);
        self
    }

    fn proto(&self) -> &'static str {
        self.protocol.name()
    }

    fn family(&self) -> Family {
        Family::of(self.cluster_ip)
    }
}

/// Writes kube-proxy's rules for `services` into the network namespace `netns` (one the test
/// created: nothing else is ever touched). `cluster_cidr` is kube-proxy's `--cluster-cidr`: one
/// CIDR, or an IPv4 and an IPv6 one separated by a comma (dual-stack). As kube-proxy's
/// dual-stack proxier does, each family with a CIDR gets its own rules for its own Services:
/// through `iptables-restore` and `ip6tables-restore`, or in tables `ip kube-proxy` and
/// `ip6 kube-proxy`.
pub fn install(netns: &str, flavour: Flavour, cluster_cidr: &str, services: &[Service]) -> Result<()> {
    let cidrs: Vec<&str> = cluster_cidr.split(',').map(str::trim).collect();
    for family in [Family::V4, Family::V6] {
        let of_family: Vec<Service> = services.iter().filter(|s| s.family() == family).cloned().collect();
        let Some(cidr) = cidrs.iter().find(|c| Family::of_cidr(c) == family) else {
            if !of_family.is_empty() {
                bail!("{family:?} Services without an {family:?} cluster CIDR in {cluster_cidr:?}");
            }
            continue;
        };
        match flavour {
            Flavour::Iptables => {
                let restore = family.iptables_restore();
                run_with_stdin(netns, restore, &["--noflush"], &iptables::rules(family, cidr, &of_family))?
            }
            Flavour::Nftables => {
                run_with_stdin(netns, "nft", &["-f", "-"], &nftables::rules(family, cidr, &of_family))?
            }
        }
    }
    Ok(())
}

/// The IPv4 iptables proxier's `iptables-restore --noflush` input (see [`install`]).
pub fn iptables_rules(cluster_cidr: &str, services: &[Service]) -> String {
    iptables::rules(Family::of_cidr(cluster_cidr), cluster_cidr, services)
}

/// The nftables proxier's table for `cluster_cidr`'s family (see [`install`]).
pub fn nftables_rules(cluster_cidr: &str, services: &[Service]) -> String {
    nftables::rules(Family::of_cidr(cluster_cidr), cluster_cidr, services)
}

/// A stable name suffix in base32 capitals, as kube-proxy derives chain names from a hash of
/// the service port (FNV-1a here: only uniqueness and stability matter).
fn short_hash(input: &str, len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let mut seed = 0xcbf2_9ce4_8422_2325u64;
    while out.len() < len {
        let mut hash = seed;
        for byte in input.bytes() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        for i in 0..12 {
            out.push(ALPHABET[((hash >> (i * 5)) & 31) as usize] as char);
        }
        seed = hash;
    }
    out.truncate(len);
    out
}

/// Runs `program` in the namespace with `stdin` as its input; fails with its stderr.
fn run_with_stdin(netns: &str, program: &str, args: &[&str], stdin: &str) -> Result<()> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {program}"))?;
    child.stdin.take().context("stdin")?.write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{program} in {netns}: {}\ninput:\n{stdin}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services() -> Vec<Service> {
        let ep = |s: &str| s.parse::<SocketAddr>().unwrap();
        vec![
            Service::new(
                "default/web:http",
                Protocol::Tcp,
                ep("10.96.1.1:80"),
                &[ep("10.244.1.2:8080"), ep("10.244.2.2:8080")],
            )
            .with_node_port(30080),
            Service::new("kube-system/kube-dns:dns", Protocol::Udp, ep("10.96.0.10:53"), &[ep("10.244.2.3:53")]),
        ]
    }

    fn services6() -> Vec<Service> {
        let ep = |s: &str| s.parse::<SocketAddr>().unwrap();
        vec![
            Service::new("default/web:http", Protocol::Tcp, ep("[fd00:10:96::1]:80"), &[ep("[fd00:10:244:1::2]:8080")])
                .with_node_port(30080),
        ]
    }

    #[test]
    fn ipv6_rules_are_spelled_for_ipv6() {
        let text = iptables_rules("fd00:10:244::/56", &services6());
        assert!(text.contains("-d fd00:10:96::1/128 -p tcp"), "{text}");
        assert!(text.contains("! -s fd00:10:244::/56 -d fd00:10:96::1/128"), "{text}");
        assert!(text.contains("-s fd00:10:244:1::2/128 -m comment"), "{text}");
        assert!(text.contains("-j DNAT --to-destination [fd00:10:244:1::2]:8080"), "{text}");
        assert!(text.contains("--dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"), "{text}");
        assert!(!text.contains("127.0.0.0/8"), "{text}");
        let text = nftables_rules("fd00:10:244::/56", &services6());
        assert!(text.starts_with("table ip6 kube-proxy {"), "{text}");
        assert!(text.contains("type ipv6_addr . inet_proto . inet_service"), "{text}");
        assert!(text.contains("ip6 saddr != fd00:10:244::/56 jump mark-for-masquerade"), "{text}");
        assert!(text.contains("dnat to [fd00:10:244:1::2]:8080"), "{text}");
        assert!(text.contains("ip6 daddr != ::1 meta l4proto"), "{text}");
        assert!(!text.contains(" ip daddr") && !text.contains(" ip saddr"), "{text}");
    }

    #[test]
    #[should_panic(expected = "another family")]
    fn a_service_has_one_family() {
        let ep = |s: &str| s.parse::<SocketAddr>().unwrap();
        Service::new("default/mixed:http", Protocol::Tcp, ep("[fd00:10:96::1]:80"), &[ep("10.244.1.2:8080")]);
    }

    #[test]
    fn iptables_rules_have_the_conntrack_drop_and_every_service() {
        let text = iptables_rules("10.244.0.0/16", &services());
        assert!(text.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"));
        assert!(text.contains("--probability 0.5000000000"), "{text}");
        assert!(text.contains("-j DNAT --to-destination 10.244.2.3:53"));
        assert!(text.contains("--dport 30080 -j KUBE-EXT-"));
        assert!(text.lines().filter(|l| l.starts_with(':')).all(|l| l.split(' ').next().unwrap().len() <= 29));
    }

    #[test]
    fn nftables_rules_name_their_chains_before_using_them() {
        let text = nftables_rules("10.244.0.0/16", &services());
        assert!(text.contains("ct state invalid drop"));
        for line in text.lines().filter(|l| l.contains("goto ")) {
            for target in line.split("goto ").skip(1) {
                let chain = target.split([',', ' ', ';']).next().unwrap();
                let declared = text.find(&format!("chain {chain} {{")).unwrap_or(usize::MAX);
                assert!(declared < text.find(line).unwrap(), "{chain} used before it is declared");
            }
        }
    }

    #[test]
    fn hashes_are_stable_and_distinct() {
        assert_eq!(short_hash("a", 16), short_hash("a", 16));
        assert_ne!(short_hash("default/a:tcp", 16), short_hash("default/b:tcp", 16));
        assert_eq!(short_hash("x", 8).len(), 8);
    }
}
