//! The rules kube-proxy writes for a set of Services, written by the test into a node namespace
//! it created, in kube-proxy's two Linux modes:
//!
//! - [`Flavour::Iptables`]: what `iptables-restore --noflush` receives from the iptables proxier
//!   (through iptables-nft here): nat `KUBE-SERVICES` → `KUBE-SVC-*` → `KUBE-SEP-*` (DNAT),
//!   `KUBE-NODEPORTS` → `KUBE-EXT-*`, `KUBE-MARK-MASQ` and `KUBE-POSTROUTING` (`MASQUERADE
//!   --random-fully` of packets marked 0x4000), and filter `KUBE-FORWARD` with `-m conntrack
//!   --ctstate INVALID -j DROP` before its mark and ESTABLISHED accepts.
//! - [`Flavour::Nftables`]: the `ip kube-proxy` table of the nftables proxier: base chains hooked
//!   just before DNAT, `services` dispatching through the `service-ips` / `service-nodeports`
//!   verdict maps (NodePorts by `fib daddr type local`), `service-*`, `external-*` and
//!   `endpoint-*` chains, the masquerade mark, and `ct state invalid drop` in `forward`.
//!
//! Both as kube-proxy runs by default: `clusterCIDR` set (so traffic from outside the cluster to
//! a ClusterIP is masqueraded), Cluster traffic policies, no session affinity, NodePorts on every
//! local address but 127.0.0.0/8, `nf_conntrack_tcp_be_liberal` off (so the INVALID drop is
//! there). The text is our own, shaped after kubernetes' pkg/proxy/{iptables,nftables}.
use std::{
    io::Write,
    net::{Ipv4Addr, SocketAddrV4},
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

/// One service port, as kube-proxy sees it: `namespace/name:port`, its ClusterIP and port, an
/// optional NodePort, and its ready endpoints (in any node, or outside the cluster).
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub node_port: Option<u16>,
    pub endpoints: Vec<SocketAddrV4>,
}

impl Service {
    /// `name` is `namespace/service:port-name`, as kube-proxy's comments print it.
    pub fn new(name: &str, protocol: Protocol, cluster_ip: SocketAddrV4, endpoints: &[SocketAddrV4]) -> Self {
        Self {
            name: name.to_string(),
            protocol,
            cluster_ip: *cluster_ip.ip(),
            port: cluster_ip.port(),
            node_port: None,
            endpoints: endpoints.to_vec(),
        }
    }

    pub fn with_node_port(mut self, node_port: u16) -> Self {
        self.node_port = Some(node_port);
        self
    }

    fn proto(&self) -> &'static str {
        self.protocol.name()
    }
}

/// Writes kube-proxy's rules for `services` into the network namespace `netns` (one the test
/// created: nothing else is ever touched). `cluster_cidr` is kube-proxy's `--cluster-cidr`.
pub fn install(netns: &str, flavour: Flavour, cluster_cidr: &str, services: &[Service]) -> Result<()> {
    match flavour {
        Flavour::Iptables => {
            run_with_stdin(netns, "iptables-restore", &["--noflush"], &iptables_rules(cluster_cidr, services))
        }
        Flavour::Nftables => run_with_stdin(netns, "nft", &["-f", "-"], &nftables_rules(cluster_cidr, services)),
    }
}

/// The `iptables-restore --noflush` input of the iptables proxier (with kubelet's
/// `KUBE-FIREWALL`), for a namespace without rules yet.
pub fn iptables_rules(cluster_cidr: &str, services: &[Service]) -> String {
    let mut filter = Lines::default();
    for chain in ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"] {
        filter.chain(chain);
    }
    filter.chain("KUBE-FIREWALL");
    let new = "-m conntrack --ctstate NEW";
    filter.rule(&format!(
        "-A INPUT {new} -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    ));
    filter.rule("-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS");
    filter.rule(&format!(
        "-A INPUT {new} -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
    ));
    filter.rule("-A INPUT -j KUBE-FIREWALL");
    filter.rule(&format!(
        "-A FORWARD {new} -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    ));
    filter.rule("-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD");
    filter.rule(&format!("-A FORWARD {new} -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"));
    filter.rule(&format!(
        "-A FORWARD {new} -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES"
    ));
    filter.rule(&format!(
        "-A OUTPUT {new} -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL"
    ));
    filter.rule(&format!("-A OUTPUT {new} -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"));
    filter.rule("-A OUTPUT -j KUBE-FIREWALL");
    filter.rule(
        "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" \
         -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
    );
    // The conntrack rules this suite is about: a forwarded packet conntrack cannot place in a
    // flow it saw (a SYN-ACK whose SYN took another path, say) is dropped.
    filter.rule("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
    filter.rule(&format!(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    ));
    filter.rule(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" \
         -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
    );

    let mut nat = Lines::default();
    for chain in ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"] {
        nat.chain(chain);
    }
    nat.rule("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    nat.rule("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    nat.rule("-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING");
    nat.rule(&format!("-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"));
    // Cleared so that a packet going through the stack again is not masqueraded twice.
    nat.rule(&format!("-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}"));
    nat.rule(
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" \
         -j MASQUERADE --random-fully",
    );
    nat.rule(&format!("-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"));
    for svc in services {
        iptables_service(&mut nat, cluster_cidr, svc);
    }
    nat.rule(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in \
         this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS",
    );
    format!("*filter\n{}COMMIT\n*nat\n{}COMMIT\n", filter.text(), nat.text())
}

/// A service port's nat chains: capture of the ClusterIP (and NodePort), the masquerade of
/// off-cluster clients, random choice of an endpoint, hairpin masquerade and DNAT.
fn iptables_service(nat: &mut Lines, cluster_cidr: &str, svc: &Service) {
    let (name, proto) = (&svc.name, svc.proto());
    let hash = short_hash(&format!("{name}{proto}"), 16);
    let (svc_chain, ext_chain) = (format!("KUBE-SVC-{hash}"), format!("KUBE-EXT-{hash}"));
    nat.chain(&svc_chain);
    let vip = format!(
        "-d {}/32 -p {proto} -m comment --comment \"{name} cluster IP\" -m {proto} --dport {}",
        svc.cluster_ip, svc.port
    );
    nat.rule(&format!("-A KUBE-SERVICES {vip} -j {svc_chain}"));
    nat.rule(&format!("-A {svc_chain} ! -s {cluster_cidr} {vip} -j KUBE-MARK-MASQ"));
    let count = svc.endpoints.len();
    for (i, endpoint) in svc.endpoints.iter().enumerate() {
        let sep_chain = format!("KUBE-SEP-{}", short_hash(&format!("{name}{proto}{endpoint}"), 16));
        nat.chain(&sep_chain);
        let comment = format!("-m comment --comment \"{name} -> {endpoint}\"");
        // Each rule takes its share of what the previous ones left; the last takes the rest.
        let pick = if i + 1 < count {
            format!(" -m statistic --mode random --probability {:.10}", 1.0 / (count - i) as f64)
        } else {
            String::new()
        };
        nat.rule(&format!("-A {svc_chain} {comment}{pick} -j {sep_chain}"));
        nat.rule(&format!("-A {sep_chain} -s {}/32 -m comment --comment {name} -j KUBE-MARK-MASQ", endpoint.ip()));
        nat.rule(&format!(
            "-A {sep_chain} -p {proto} -m comment --comment {name} -m {proto} -j DNAT --to-destination {endpoint}"
        ));
    }
    if let Some(node_port) = svc.node_port {
        nat.chain(&ext_chain);
        nat.rule(&format!(
            "-A KUBE-NODEPORTS -p {proto} -m comment --comment {name} -m {proto} --dport {node_port} -j {ext_chain}"
        ));
        // externalTrafficPolicy Cluster: the endpoint may be on another node, so the reply must
        // come back through this one.
        nat.rule(&format!(
            "-A {ext_chain} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"
        ));
        nat.rule(&format!("-A {ext_chain} -j {svc_chain}"));
    }
}

/// The `nft -f` input of the nftables proxier: one `ip kube-proxy` table. Chains come before
/// the rules and map elements that name them.
pub fn nftables_rules(cluster_cidr: &str, services: &[Service]) -> String {
    let mut chains = String::new();
    let mut service_ips = Vec::new();
    let mut node_ports = Vec::new();
    for svc in services {
        let proto = svc.proto();
        let base = {
            let (service, port_name) = svc.name.split_once(':').unwrap_or((&svc.name, ""));
            format!("{service}/{proto}/{port_name}")
        };
        let service_chain = format!("service-{}-{base}", short_hash(&base, 8));
        let mut targets = Vec::new();
        for (i, endpoint) in svc.endpoints.iter().enumerate() {
            let endpoint_base = format!("{base}__{}/{}", endpoint.ip(), endpoint.port());
            let endpoint_chain = format!("endpoint-{}-{endpoint_base}", short_hash(&endpoint_base, 8));
            chains += &format!(
                "  chain {endpoint_chain} {{\n    ip saddr {} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {endpoint}\n  }}\n",
                endpoint.ip()
            );
            targets.push(format!("{i} : goto {endpoint_chain}"));
        }
        chains += &format!(
            "  chain {service_chain} {{\n    ip daddr {} {proto} dport {} ip saddr != {cluster_cidr} jump mark-for-masquerade\n    \
             numgen random mod {} vmap {{ {} }}\n  }}\n",
            svc.cluster_ip,
            svc.port,
            targets.len(),
            targets.join(", ")
        );
        service_ips.push(format!("{} . {proto} . {} : goto {service_chain}", svc.cluster_ip, svc.port));
        if let Some(node_port) = svc.node_port {
            let external_chain = format!("external-{}-{base}", short_hash(&base, 8));
            chains +=
                &format!("  chain {external_chain} {{\n    jump mark-for-masquerade\n    goto {service_chain}\n  }}\n");
            node_ports.push(format!("{proto} . {node_port} : goto {external_chain}"));
        }
    }
    let elements = |list: &[String]| {
        if list.is_empty() { String::new() } else { format!("; elements = {{ {} }}", list.join(", ")) }
    };
    let local_node_port = "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport";
    format!(
        "table ip kube-proxy {{
  comment \"rules for kube-proxy\"
  chain mark-for-masquerade {{
    mark set mark or {MASQ_MARK}
  }}
  chain masquerading {{
    mark and {MASQ_MARK} == 0 return
    mark set mark xor {MASQ_MARK}
    masquerade fully-random
  }}
  chain forward {{
    ct state invalid drop
  }}
  chain reject-chain {{
    reject
  }}
  map no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict; }}
  map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; }}
  chain endpoints-check {{
    ip daddr . meta l4proto . th dport vmap @no-endpoint-services
    {local_node_port} vmap @no-endpoint-nodeports
  }}
  chain firewall-check {{
  }}
{chains}  map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict{}; }}
  map service-nodeports {{ type inet_proto . inet_service : verdict{}; }}
  chain services {{
    ip daddr . meta l4proto . th dport vmap @service-ips
    {local_node_port} vmap @service-nodeports
  }}
  chain filter-input {{
    type filter hook input priority -101; policy accept;
    ct state new jump endpoints-check
    ct state new jump firewall-check
  }}
  chain filter-forward {{
    type filter hook forward priority -101; policy accept;
    ct state new jump endpoints-check
    jump forward
    ct state new jump firewall-check
  }}
  chain filter-output {{
    type filter hook output priority -101; policy accept;
    ct state new jump endpoints-check
    ct state new jump firewall-check
  }}
  chain nat-prerouting {{
    type nat hook prerouting priority -100; policy accept;
    jump services
  }}
  chain nat-output {{
    type nat hook output priority -100; policy accept;
    jump services
  }}
  chain nat-postrouting {{
    type nat hook postrouting priority 100; policy accept;
    jump masquerading
  }}
}}
",
        elements(&service_ips),
        elements(&node_ports),
    )
}

/// Lines of one table of an iptables-restore input: chain declarations, then rules.
#[derive(Default)]
struct Lines {
    chains: String,
    rules: String,
}

impl Lines {
    fn chain(&mut self, name: &str) {
        self.chains += &format!(":{name} - [0:0]\n");
    }

    fn rule(&mut self, rule: &str) {
        self.rules += rule;
        self.rules.push('\n');
    }

    fn text(&self) -> String {
        format!("{}{}", self.chains, self.rules)
    }
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
        let ep = |s: &str| s.parse::<SocketAddrV4>().unwrap();
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
