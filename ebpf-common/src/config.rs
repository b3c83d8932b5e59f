//! Load-time configuration of a network's datapath: set as a global when the programs are
//! loaded (once per network), read by every program. Fixed until the network's last pod is gone.

/// The datapath's settings. IPv4 for now; IPv6 fields will be added with a layout bump.
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
    /// Ports a masqueraded flow may get when its own source port is taken, inclusive.
    pub port_min: u16,
    pub port_max: u16,
}

impl DatapathConfig {
    /// Whether `addr` (network byte order octets) is in the cluster CIDR.
    #[inline(always)]
    pub fn in_cluster(&self, addr: [u8; 4]) -> bool {
        let mask = prefix_mask(self.cluster_prefix);
        u32::from_be_bytes(addr) & mask == u32::from_be_bytes(self.cluster_ipv4) & mask
    }
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
}
