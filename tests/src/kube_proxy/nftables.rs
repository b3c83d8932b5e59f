//! The `nft -f` input of kube-proxy's nftables proxier: one table `kube-proxy` per family, `ip`
//! for the IPv4 proxier and `ip6` for the IPv6 one (the same chains; addresses matched with
//! `ip`/`ip6` and typed `ipv4_addr`/`ipv6_addr`). Chains come before the rules and map
//! elements that name them.
use super::{Family, MASQ_MARK, Service, short_hash};

/// One family's table; `services` are all of `family`.
pub fn rules(family: Family, cluster_cidr: &str, services: &[Service]) -> String {
    let (ip, addr_type, loopback) = (family.nft(), family.nft_addr_type(), family.nft_loopback());
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
            // A chain name has no colons: kube-proxy writes an IPv6 endpoint's with dots.
            let endpoint_ip = endpoint.ip().to_string().replace(':', ".");
            let endpoint_base = format!("{base}__{endpoint_ip}/{}", endpoint.port());
            let endpoint_chain = format!("endpoint-{}-{endpoint_base}", short_hash(&endpoint_base, 8));
            // `dnat to [ip]:port` for IPv6 (SocketAddr's Display), as kube-proxy joins them.
            chains += &format!(
                "  chain {endpoint_chain} {{\n    {ip} saddr {} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {endpoint}\n  }}\n",
                endpoint.ip()
            );
            targets.push(format!("{i} : goto {endpoint_chain}"));
        }
        chains += &format!(
            "  chain {service_chain} {{\n    {ip} daddr {} {proto} dport {} {ip} saddr != {cluster_cidr} jump mark-for-masquerade\n    \
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
    let local_node_port = format!("fib daddr type local {ip} daddr != {loopback} meta l4proto . th dport");
    format!(
        "table {ip} kube-proxy {{
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
  map no-endpoint-services {{ type {addr_type} . inet_proto . inet_service : verdict; }}
  map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; }}
  chain endpoints-check {{
    {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services
    {local_node_port} vmap @no-endpoint-nodeports
  }}
  chain firewall-check {{
  }}
{chains}  map service-ips {{ type {addr_type} . inet_proto . inet_service : verdict{}; }}
  map service-nodeports {{ type inet_proto . inet_service : verdict{}; }}
  chain services {{
    {ip} daddr . meta l4proto . th dport vmap @service-ips
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
