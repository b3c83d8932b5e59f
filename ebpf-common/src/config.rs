//! Load-time configuration of a network's datapath: set as a global when the programs are
//! loaded (once per network), read by every program. Fixed until the network's last pod is gone.

/// The datapath's settings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Pod addresses of the whole cluster (all nodes): never masqueraded, and forwarded to other
    /// nodes through the FIB. Network address in network byte order, plus prefix length.
    pub cluster_ipv4: [u8; 4],
    pub cluster_prefix: u8,
    /// 1 when pod → outside traffic is masqueraded (`ipMasq`).
    pub masquerade: u8,
    pub pad: [u8; 2],
    /// The node's address that masqueraded flows leave with.
    pub node_ipv4: [u8; 4],
    /// The interface masquerade happens on (egress) and is undone on (ingress).
    pub uplink_ifindex: u32,
    /// The ports masqueraded flows leave from, inclusive. Disjoint from the node's own
    /// ephemeral ports, so that a reply to the node is never taken for a pod's.
    pub port_min: u16,
    pub port_max: u16,
    /// This node's pod subnet: an address in it that is no pod's goes nowhere (it would
    /// otherwise follow the default route out, with a pod's source address).
    pub node_pods_ipv4: [u8; 4],
    pub node_pods_prefix: u8,
    pub pad2: [u8; 3],
    /// New masqueraded flows one pod may open per minute (`POD_FLOWS`); 0: no limit.
    pub pod_flows_per_minute: u32,
    /// The cluster's IPv6 pod addresses (prefix 0: the network has no IPv6).
    pub cluster_ipv6: [u8; 16],
    pub cluster_prefix6: u8,
    /// This node's IPv6 pod subnet, as `node_pods_ipv4` (prefix 0: none set).
    pub node_pods_prefix6: u8,
    pub pad3: [u8; 2],
    pub node_pods_ipv6: [u8; 16],
    /// The node's address masqueraded IPv6 flows leave with (all zero: IPv6 is not masqueraded).
    pub node_ipv6: [u8; 16],
}

impl DatapathConfig {
    /// Whether `addr` (network byte order octets) is in the cluster CIDR.
    #[inline(always)]
    pub fn in_cluster(&self, addr: [u8; 4]) -> bool {
        in_prefix(addr, self.cluster_ipv4, self.cluster_prefix)
    }

    /// Whether `addr` is in this node's pod subnet (none set: never).
    #[inline(always)]
    pub fn in_node_pods(&self, addr: [u8; 4]) -> bool {
        self.node_pods_prefix != 0 && in_prefix(addr, self.node_pods_ipv4, self.node_pods_prefix)
    }

    /// Whether `addr` is in the cluster's IPv6 range (none set: never).
    #[inline(always)]
    pub fn in_cluster6(&self, addr: &[u8; 16]) -> bool {
        self.cluster_prefix6 != 0 && in_prefix6(addr, &self.cluster_ipv6, self.cluster_prefix6)
    }

    /// Whether `addr` is in this node's IPv6 pod subnet (none set: never).
    #[inline(always)]
    pub fn in_node_pods6(&self, addr: &[u8; 16]) -> bool {
        self.node_pods_prefix6 != 0 && in_prefix6(addr, &self.node_pods_ipv6, self.node_pods_prefix6)
    }

    /// Whether IPv6 flows to the outside are masqueraded.
    #[inline(always)]
    pub fn masquerades6(&self) -> bool {
        self.masquerade != 0 && self.node_ipv6 != [0; 16]
    }

    /// Whether `port` is one masquerade hands out.
    #[inline(always)]
    pub fn is_masq_port(&self, port: u16) -> bool {
        port >= self.port_min && port <= self.port_max
    }
}

#[inline(always)]
fn in_prefix(addr: [u8; 4], network: [u8; 4], prefix: u8) -> bool {
    let mask = prefix_mask(prefix);
    u32::from_be_bytes(addr) & mask == u32::from_be_bytes(network) & mask
}

/// Byte by byte, leaving at the first difference: BPF has no unaligned wide loads, and
/// assembling 64-bit words from bytes keeps so many values alive that the compiler spills them
/// onto the 512-byte stack.
#[inline(always)]
fn in_prefix6(addr: &[u8; 16], network: &[u8; 16], prefix: u8) -> bool {
    for i in 0..16 {
        let bits = prefix.saturating_sub(8 * i as u8).min(8);
        let mask = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
        if (addr[i] ^ network[i]) & mask != 0 {
            return false;
        }
    }
    true
}

#[inline(always)]
const fn prefix_mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        1..=31 => u32::MAX << (32 - prefix as u32),
        _ => u32::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_membership() {
        let c = DatapathConfig { cluster_ipv4: [10, 244, 0, 0], cluster_prefix: 16, ..Default::default() };
        assert!(c.in_cluster([10, 244, 7, 9]));
        assert!(!c.in_cluster([10, 245, 0, 1]));
        let all = DatapathConfig { cluster_prefix: 0, ..Default::default() };
        assert!(all.in_cluster([8, 8, 8, 8]));
        let host = DatapathConfig { cluster_ipv4: [10, 0, 0, 1], cluster_prefix: 32, ..Default::default() };
        assert!(host.in_cluster([10, 0, 0, 1]) && !host.in_cluster([10, 0, 0, 2]));
    }

    #[test]
    fn ipv6_cluster_membership() {
        let v6 = |s: &str| s.parse::<core::net::Ipv6Addr>().unwrap().octets();
        let none = DatapathConfig::default();
        assert!(!none.in_cluster6(&v6("fd00::1")), "no IPv6 range: nothing is in it");
        for (prefix, inside, outside) in [
            (56, "fd00:10:244:ff::9", "fd00:10:245::1"),
            (96, "fd00:10:244::7:1", "fd00:10:244::1:0:1"),
            (128, "fd00:10:244::", "fd00:10:244::1"),
        ] {
            let c = DatapathConfig { cluster_ipv6: v6("fd00:10:244::"), cluster_prefix6: prefix, ..Default::default() };
            assert!(c.in_cluster6(&v6(inside)), "/{prefix} {inside}");
            assert!(!c.in_cluster6(&v6(outside)), "/{prefix} {outside}");
        }
    }
}
