//! One attachment = one (container ID, interface name) pair, as CNI 1.1 defines it. Everything
//! we create for it is named from that pair, so DEL and GC find it again without any other state.
use sha2::{Digest, Sha256};

/// Host-side veth names start with this, so an operator can tell ours apart (`ip link`).
const HOST_PREFIX: &str = "ecni";

pub struct Attachment {
    digest: [u8; 32],
}

impl Attachment {
    pub fn new(container_id: &str, ifname: &str) -> Self {
        let digest = Sha256::new().chain_update(container_id).chain_update("/").chain_update(ifname).finalize().into();
        Self { digest }
    }

    /// `ecni` + 11 hex digits: 15 bytes, the kernel's limit, stable for the same pair.
    pub fn host_ifname(&self) -> String {
        let hex: String = self.digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{HOST_PREFIX}{}", &hex[..15 - HOST_PREFIX.len()])
    }

    /// Owner tag stored in map entries.
    pub fn cookie(&self) -> u64 {
        u64::from_le_bytes(self.digest[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let a = Attachment::new("abc", "eth0");
        assert_eq!(a.host_ifname().len(), 15);
        assert_eq!(a.host_ifname(), Attachment::new("abc", "eth0").host_ifname());
        assert_ne!(a.host_ifname(), Attachment::new("abc", "eth1").host_ifname());
        assert_ne!(a.cookie(), Attachment::new("abd", "eth0").cookie());
    }
}
