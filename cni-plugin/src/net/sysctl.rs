//! Per-interface IPv6 settings (`/proc/sys/net/ipv6/conf/<ifname>/<key>`) of the network
//! namespace the calling thread is in (`Netns::run` for the pod's). Set before the link comes up,
//! so the first address and the first packet already follow them.
use std::{fs, io, net::Ipv6Addr};

/// Pod side: a link-local address derived from the MAC (the datapath vouches for exactly that
/// one), no duplicate address detection (IPAM made the addresses unique; DAD would hold them
/// tentative for a second), and no router advertisements (routes come from the CNI result, and
/// no router solicitation is ever sent).
pub const POD: [(&str, &str); 4] =
    [("disable_ipv6", "0"), ("addr_gen_mode", "0"), ("accept_dad", "0"), ("accept_ra", "0")];

/// Host side: its link-local address usable at once, so the node resolves the pod at once.
pub const HOST: [(&str, &str); 2] = [("accept_dad", "0"), ("accept_ra", "0")];

/// Host side of a pod without IPv6: none at all. Its link-local address would add two routes
/// (and the multicast route) to the node's IPv6 table per pod, and the kernel walks that whole
/// table whenever an interface goes (`rt6_sync_down_dev`): every DEL would cost more the more
/// pods the node has.
pub const HOST_NO_IPV6: [(&str, &str); 1] = [("disable_ipv6", "1")];

pub fn apply(ifname: &str, settings: &[(&str, &str)]) -> io::Result<()> {
    for (key, value) in settings {
        let path = format!("/proc/sys/net/ipv6/conf/{ifname}/{key}");
        fs::write(&path, value).map_err(|e| io::Error::new(e.kind(), format!("writing {value} to {path}: {e}")))?;
    }
    Ok(())
}

/// The link-local address the kernel derives from `mac` with `addr_gen_mode` 0 (EUI-64).
pub fn eui64_link_local(mac: [u8; 6]) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 0x02, b, c, 0xff, 0xfe, d, e, f])
}

#[cfg(test)]
mod tests {
    #[test]
    fn link_local_from_mac() {
        let ll = super::eui64_link_local([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05]);
        assert_eq!(ll.to_string(), "fe80::858:aff:fef4:105");
    }
}
