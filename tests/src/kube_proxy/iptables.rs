//! The `iptables-restore --noflush` input of kube-proxy's iptables proxier (with kubelet's
//! `KUBE-FIREWALL`), one family's: the IPv4 proxier writes it with `iptables-restore`, the IPv6
//! one the same chains with `ip6tables-restore`.
use super::{Family, MASQ_MARK, Service, short_hash};

/// The rules for a namespace without rules yet. `services` are all of `family`.
pub fn rules(family: Family, cluster_cidr: &str, services: &[Service]) -> String {
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
    // kubelet blocks localnet connections for IPv4 only (route_localnet); IPv6 has no such rule.
    if family == Family::V4 {
        filter.rule(
            "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet \
             connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
        );
    }
    // The conntrack rules the Service suites are about: a forwarded packet conntrack cannot
    // place in a flow it saw (a SYN-ACK whose SYN took another path, say) is dropped.
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
        service(&mut nat, family, cluster_cidr, svc);
    }
    // IPv6 NodePorts never work on ::1; IPv4 ones only with route_localnet, which is off.
    nat.rule(&format!(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in \
         this chain\" -m addrtype --dst-type LOCAL ! -d {} -j KUBE-NODEPORTS",
        family.loopback()
    ));
    format!("*filter\n{}COMMIT\n*nat\n{}COMMIT\n", filter.text(), nat.text())
}

/// A service port's nat chains: capture of the ClusterIP (and NodePort), the masquerade of
/// off-cluster clients, random choice of an endpoint, hairpin masquerade and DNAT.
fn service(nat: &mut Lines, family: Family, cluster_cidr: &str, svc: &Service) {
    let (name, proto, host) = (&svc.name, svc.proto(), family.host_bits());
    let hash = short_hash(&format!("{name}{proto}"), 16);
    let (svc_chain, ext_chain) = (format!("KUBE-SVC-{hash}"), format!("KUBE-EXT-{hash}"));
    nat.chain(&svc_chain);
    let vip = format!(
        "-d {}/{host} -p {proto} -m comment --comment \"{name} cluster IP\" -m {proto} --dport {}",
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
        nat.rule(&format!("-A {sep_chain} -s {}/{host} -m comment --comment {name} -j KUBE-MARK-MASQ", endpoint.ip()));
        // `[ip]:port` for IPv6, as kube-proxy writes it (SocketAddr's Display does the same).
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
