//! Address prefixes as `POLICY_IDENTITIES` keys them: a pod's address, an `ipBlock`'s CIDR or
//! one of its `except` entries, the `/0` of each family.
use std::{fmt, net::IpAddr};

use ebpf_common::{IpKey, identity_prefix_len};

/// An address and a prefix length, host bits zero; ordered (family, address, length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub bits: u8,
}

impl Prefix {
    /// `10.0.0.0/8`, `fd00::/64`; host bits set are cleared (the API takes them as given).
    pub fn parse(text: &str) -> Option<Self> {
        let (addr, bits) = text.trim().split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let bits: u8 = bits.parse().ok()?;
        (bits <= max_bits(addr)).then(|| Self::new(addr, bits))
    }

    pub fn new(addr: IpAddr, bits: u8) -> Self {
        Self { addr: mask(addr, bits), bits }
    }

    pub fn host(addr: IpAddr) -> Self {
        Self { addr, bits: max_bits(addr) }
    }

    /// `0.0.0.0/0` or `::/0`.
    pub fn everything(v6: bool) -> Self {
        let addr: IpAddr =
            if v6 { std::net::Ipv6Addr::UNSPECIFIED.into() } else { std::net::Ipv4Addr::UNSPECIFIED.into() };
        Self { addr, bits: 0 }
    }

    /// Whether every address of `other` is in this prefix.
    pub fn contains(&self, other: &Prefix) -> bool {
        self.addr.is_ipv4() == other.addr.is_ipv4()
            && self.bits <= other.bits
            && mask(other.addr, self.bits) == self.addr
    }

    #[cfg(test)]
    pub fn contains_addr(&self, addr: IpAddr) -> bool {
        self.contains(&Prefix::host(addr))
    }

    /// The trie's key: family word, then the address; `prefix_len` counts the family word.
    pub fn key(&self) -> (IpKey, u32) {
        let key = match self.addr {
            IpAddr::V4(a) => IpKey::v4(a.octets()),
            IpAddr::V6(a) => IpKey::v6(a.octets()),
        };
        (key, identity_prefix_len(u32::from(self.bits)))
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

fn max_bits(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn mask(addr: IpAddr, bits: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let m = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_masks_and_contains() {
        let block = Prefix::parse("10.1.2.3/16").unwrap();
        assert_eq!(block.to_string(), "10.1.0.0/16");
        assert!(block.contains_addr("10.1.200.7".parse().unwrap()));
        assert!(!block.contains_addr("10.2.0.1".parse().unwrap()));
        assert!(!block.contains_addr("fd00::1".parse().unwrap()), "another family");
        assert!(Prefix::everything(false).contains(&block));
        assert!(!block.contains(&Prefix::everything(false)));
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "fd00::/129", ""] {
            assert_eq!(Prefix::parse(bad), None, "{bad}");
        }
        let v6 = Prefix::parse("fd00:1::/32").unwrap();
        assert!(v6.contains_addr("fd00:1::42".parse().unwrap()));
        assert_eq!(v6.key().1, 64);
        assert_eq!(Prefix::host("10.0.0.1".parse().unwrap()).key().1, 64);
    }
}
