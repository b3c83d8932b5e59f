//! One attachment = one (container ID, interface name) pair, as CNI 1.1 defines it. Everything
//! we create for it is named from that pair, so DEL and GC find it again without any other state.
use std::{
    os::{linux::net::SocketAddrExt as _, unix::net::UnixListener},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};

use crate::cni::{
    CniError, CniResult, ErrorCode,
    bandwidth::{Bandwidth, Limit},
};

/// How long a verb waits for another verb on the same attachment before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Host-side veth names start with this, so an operator can tell ours apart (`ip link`).
const HOST_PREFIX: &str = "ecni";

/// The IFB device of a pod with an egress limit (`net/ifb.rs`): `ecnb` (bandwidth) and the
/// same digits as its host veth.
const IFB_PREFIX: &str = "ecnb";

/// Host-side veths carry the alias `ebpf-cni/<network>/<containerID>/<ifname>`: GC finds a
/// network's veths by it, and `ip link` tells an operator whose veth it is.
pub const ALIAS_PREFIX: &str = "ebpf-cni/";

/// The kernel keeps at most this many bytes of an alias.
const ALIAS_MAX: usize = 255;

/// The host veth's alias (and its IFB's, if any); `ebpf-cni/<network>` alone when the whole would
/// not fit. The pod's bandwidth limits follow as ` ingress=<bit/s>:<bits>` and ` egress=…`, for
/// `inspect`: what ADD was asked for, beside the qdiscs that hold it.
pub fn alias(network: &str, container_id: &str, ifname: &str, bandwidth: &Bandwidth) -> String {
    let limits: String = [("ingress", bandwidth.ingress), ("egress", bandwidth.egress)]
        .into_iter()
        .filter_map(|(direction, limit)| limit.map(|l| format!(" {direction}={}:{}", l.rate, l.burst)))
        .collect();
    let full = format!("{ALIAS_PREFIX}{network}/{container_id}/{ifname}{limits}");
    if full.len() <= ALIAS_MAX { full } else { format!("{ALIAS_PREFIX}{network}") }
}

/// The network and, when recorded, the (container ID, ifname) an alias names. Network names,
/// container IDs and interface names hold no space: the first one ends them.
pub fn parse_alias(alias: &str) -> Option<(&str, Option<(&str, &str)>)> {
    let path = alias.split(' ').next().unwrap_or_default();
    let mut parts = path.strip_prefix(ALIAS_PREFIX)?.splitn(3, '/');
    let network = parts.next()?;
    let pair = parts.next().zip(parts.next());
    Some((network, pair))
}

/// The bandwidth limits an alias records (none when it records none).
pub fn alias_limits(alias: &str) -> Bandwidth {
    let mut bandwidth = Bandwidth::default();
    for word in alias.split(' ').skip(1) {
        let Some((direction, limit)) = word.split_once('=') else { continue };
        let Some((rate, burst)) = limit.split_once(':') else { continue };
        let (Ok(rate), Ok(burst)) = (rate.parse(), burst.parse()) else { continue };
        match direction {
            "ingress" => bandwidth.ingress = Some(Limit { rate, burst }),
            "egress" => bandwidth.egress = Some(Limit { rate, burst }),
            _ => {}
        }
    }
    bandwidth
}

/// The IFB name that goes with a host veth's name; none for a name that is not one of ours.
pub fn ifb_name_of(host_ifname: &str) -> Option<String> {
    host_ifname.strip_prefix(HOST_PREFIX).map(|digits| format!("{IFB_PREFIX}{digits}"))
}

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
        format!("{HOST_PREFIX}{}", &self.hex()[..15 - HOST_PREFIX.len()])
    }

    /// The whole digest in hex: a file name that stands for the pair.
    pub fn hex(&self) -> String {
        self.digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `ecnb` + the host veth's 11 hex digits: the IFB holding the pod's egress limit.
    pub fn ifb_name(&self) -> String {
        ifb_name_of(&self.host_ifname()).expect("a host veth's name")
    }

    /// Waits until no other ADD, DEL or CHECK of this attachment runs, then holds it off until
    /// the guard drops. The lock is an abstract unix socket name in the node's network
    /// namespace: the kernel frees it when the holder exits, crashed or not, and it leaves no
    /// file behind. Runtimes do not normally overlap verbs of one attachment, but a DEL racing
    /// a slow ADD must not leave half of each.
    pub fn lock(&self) -> CniResult<AttachmentLock> {
        let name = format!("ebpf-cni/attachment/{}", self.host_ifname());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| CniError::new(ErrorCode::INTERNAL, "bad lock name").with_details(e))?;
        let started = Instant::now();
        loop {
            match UnixListener::bind_addr(&addr) {
                Ok(socket) => return Ok(AttachmentLock { _socket: socket }),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => {
                    return Err(CniError::new(
                        ErrorCode::TRY_AGAIN_LATER,
                        format!("another call on this attachment has run for over {LOCK_WAIT:?}"),
                    )
                    .with_details(e));
                }
            }
        }
    }

    /// Owner tag stored in map entries.
    pub fn cookie(&self) -> u64 {
        u64::from_le_bytes(self.digest[..8].try_into().expect("8 bytes"))
    }
}

/// Held while a verb works on one attachment; see [`Attachment::lock`].
pub struct AttachmentLock {
    _socket: UnixListener,
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
        assert_eq!(a.ifb_name().len(), 15);
        assert_eq!(a.ifb_name()[4..], a.host_ifname()[4..]);
        assert_ne!(a.ifb_name(), a.host_ifname());
    }

    #[test]
    fn one_holder_per_attachment() {
        let a = Attachment::new(&format!("lock-test-{}", std::process::id()), "eth0");
        let held = a.lock().unwrap();
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            let _second = a.lock().unwrap();
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert!(waiter.join().unwrap() >= Duration::from_millis(45));
    }

    #[test]
    fn aliases_round_trip() {
        let none = Bandwidth::default();
        assert_eq!(parse_alias(&alias("net", "abc", "eth0", &none)), Some(("net", Some(("abc", "eth0")))));
        let long = "c".repeat(300);
        assert_eq!(parse_alias(&alias("net", &long, "eth0", &none)), Some(("net", None)));
        assert_eq!(parse_alias("something else"), None);
        assert_eq!(alias_limits(&alias("net", "abc", "eth0", &none)), none);
    }

    #[test]
    fn limits_ride_behind_the_attachment() {
        let limited = Bandwidth { ingress: None, egress: Some(Limit { rate: 10_000_000, burst: 200_000 }) };
        let text = alias("net", "abc", "eth0", &limited);
        assert_eq!(text, "ebpf-cni/net/abc/eth0 egress=10000000:200000");
        assert_eq!(parse_alias(&text), Some(("net", Some(("abc", "eth0")))), "GC still finds the attachment");
        assert_eq!(alias_limits(&text), limited);
    }
}
