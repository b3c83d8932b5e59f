/// Address family tag of an [`IpKey`].
pub const FAMILY_IPV4: u8 = 4;
pub const FAMILY_IPV6: u8 = 6;

/// Key of address-indexed maps. Sized for IPv6 from the first version so that dual-stack adds
/// code paths, not a new map layout. An IPv4 address sits in the first four bytes, the rest zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpKey {
    pub family: u8,
    pub pad: [u8; 3],
    pub addr: [u8; 16],
}

impl IpKey {
    /// Built from five 32-bit words, not field by field: on the BPF target zeroing the padding
    /// and the 12 unused address bytes compiled to two calls of a byte-by-byte `memset`, on
    /// every packet. Same bytes: the family byte first, then zeros, then the address.
    pub const fn v4(octets: [u8; 4]) -> Self {
        let words = [u32::from_ne_bytes([FAMILY_IPV4, 0, 0, 0]), u32::from_ne_bytes(octets), 0, 0, 0];
        // SAFETY: `IpKey` is `#[repr(C)]`, 20 bytes of plain integers, no padding and no
        // invalid values; `from_ne_bytes` keeps each byte where its field is.
        unsafe { core::mem::transmute::<[u32; 5], IpKey>(words) }
    }

    /// An IPv6 address's key. The family and padding as one word: the three zero bytes of
    /// the padding compiled to a call of a byte-by-byte `memset` on the BPF target.
    pub const fn v6(addr: [u8; 16]) -> Self {
        #[repr(C)]
        struct Words {
            head: u32,
            addr: [u8; 16],
        }
        let head = u32::from_ne_bytes([FAMILY_IPV6, 0, 0, 0]);
        // SAFETY: both `#[repr(C)]`, 20 bytes without padding: the family byte and the three
        // zero bytes of `pad` are `head`'s, in memory order.
        unsafe { core::mem::transmute::<Words, IpKey>(Words { head, addr }) }
    }

    /// The same key built from words, as [`IpKey::v4`]: `from_pod`'s, where zeroing the padding
    /// field by field was one more byte-loop `memset` call per lookup. Not everywhere: in the
    /// Service programs, which sit at the verifier's 512-byte stack limit, it moved their stack
    /// past it.
    pub const fn v6_words(a: [u8; 16]) -> Self {
        let words = [
            u32::from_ne_bytes([FAMILY_IPV6, 0, 0, 0]),
            u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
            u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
            u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
            u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
        ];
        // SAFETY: as in `v4`.
        unsafe { core::mem::transmute::<[u32; 5], IpKey>(words) }
    }
}

/// `Endpoint::flags`: the key is the pod's IPv6 link-local address. It vouches for the pod's
/// own link-local traffic (neighbour discovery, MLD) and is never a destination: link-local
/// packets stay on their link.
pub const ENDPOINT_LINK_LOCAL: u32 = 1;

/// `Endpoint::flags`: the pod has an ingress bandwidth limit, a TBF qdisc on its host veth.
/// Packets for it go through that veth's egress (`bpf_redirect`), where the qdisc sees them,
/// rather than straight into the pod with `bpf_redirect_peer`, which would skip it.
pub const ENDPOINT_SHAPED: u32 = 2;

/// `Endpoint::flags`: the pod has an egress bandwidth limit, a TBF qdisc on an IFB device of
/// the node that a classic tc filter after `from_pod`, on the host veth's ingress, feeds
/// (mirred). `from_pod` hands such a pod's packets on ("next") instead of redirecting them, so
/// that the filter sees every one, and the node's stack forwards them once shaped. Packets
/// *for* the pod take the stack too (`deliver.rs`), so that conntrack sees both directions of
/// its flows.
pub const ENDPOINT_EGRESS_SHAPED: u32 = 4;

/// An IPv4 address in a 16-byte address field: the four octets first, the rest zero.
///
/// Built from words, as [`IpKey::v4`]: on the BPF target the twelve zero bytes of the array
/// compiled to a call of a byte-by-byte `memset`, 44 of them in `to_uplink` alone, each walked
/// by the verifier (twelve rounds of its loop) on every path through it, and run per packet.
pub const fn ipv4_in_16(a: [u8; 4]) -> [u8; 16] {
    let words = [u32::from_ne_bytes(a), 0, 0, 0];
    // SAFETY: sixteen bytes either way; `from_ne_bytes` keeps the octets in their places.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(words) }
}

/// A pod interface on this node: value of `ENDPOINTS`, keyed by the pod's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Index of the host-side veth in the node namespace (the target of `bpf_redirect_peer`).
    pub host_ifindex: u32,
    /// [`ENDPOINT_LINK_LOCAL`], [`ENDPOINT_SHAPED`], [`ENDPOINT_EGRESS_SHAPED`], or 0.
    pub flags: u32,
    /// Which attachment (container ID + ifname) owns the entry, so that DEL and GC find it
    /// whatever the IPAM plugin and even when the veth is already gone.
    pub owner: u64,
    /// MAC of the pod's interface: destination of frames delivered into the pod.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth: the gateway MAC the pod sees, source of delivered frames.
    pub host_mac: [u8; 6],
    /// The stack epoch (`STACK_EPOCH`, see ebpf-common's `flows.rs`) in which the node's stack
    /// last handed this pod a flow: a Service's client delivered to it (`to_pod`), or a packet of
    /// it sent on to another node (`to_uplink`, a Service's remote endpoint). While it is
    /// current, this pod's packets to other pods and other nodes' packets to it need a look in
    /// `FLOWS` before a fast path; once its flows are gone it lapses, and the pod is back on the
    /// fast path at no cost. 0: never. The plugin writes 0; the agent renews it for pods whose
    /// flows live on.
    pub stack_epoch: u32,
}

/// Value of `HOST_VETHS`: the pod behind a host veth, as `from_pod` needs it for every packet
/// the pod sends, in an array slot found from the veth's ifindex (`ifindex %
/// HOST_VETHS_SLOTS`) rather than by hashing the packet's source address into `ENDPOINTS`. Only
/// a shortcut: a slot that holds another veth (ifindexes only grow, so two live veths may share
/// a slot; the later ADD takes it), or a source that is not the slot's address, is looked up in
/// `ENDPOINTS` as before, and only that lookup drops a spoofed source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostVeth {
    /// The host veth's ifindex; 0: a free slot.
    pub ifindex: u32,
    /// The pod's `Endpoint::flags` (never `ENDPOINT_LINK_LOCAL`).
    pub flags: u32,
    /// The attachment, as `Endpoint::owner`.
    pub owner: u64,
    /// The pod's stack epoch, marked and renewed with its `ENDPOINTS` entries' (the highest of
    /// its addresses', so both families' flows are looked up while either's lives: never fewer
    /// lookups than `ENDPOINTS` would give).
    pub stack_epoch: u32,
    /// The pod's IPv4 address; all zero: none (its packets take `ENDPOINTS`).
    pub ipv4: [u8; 4],
    /// The pod's global IPv6 address; all zero: none. Its link-local one is not here.
    pub ipv6: [u8; 16],
}

/// Slots of `HOST_VETHS`. A power of two, so the slot is a mask of the ifindex. 4,096 slots of
/// 40 bytes are 160 KiB; with kubelet's default of 110 pods a new veth finds its slot held by
/// another live one about 3 % of the time, and that pod's packets take `ENDPOINTS`.
pub const HOST_VETHS_SLOTS: u32 = 4_096;

/// The `HOST_VETHS` slot of host veth `ifindex`.
pub const fn host_veth_slot(ifindex: u32) -> u32 {
    ifindex & (HOST_VETHS_SLOTS - 1)
}

/// The benchmarks' floor program's one setting (a load-time global): where it redirects every
/// frame, and the MACs it writes. Not part of the pinned layout: the plugin never loads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloorTarget {
    /// The host veth of the pod the frames go into (`bpf_redirect_peer`).
    pub ifindex: u32,
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
}

/// Per-CPU packet and byte counts for one drop reason (value of `METRICS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v6_keys_are_the_fields_written_out() {
        let addr = [0xfd, 0, 0x10, 0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
        assert_eq!(IpKey::v6_words(addr), IpKey::v6(addr));
        assert_eq!(IpKey::v6(addr), IpKey { family: FAMILY_IPV6, pad: [0; 3], addr });
    }

    #[test]
    fn an_ipv4_address_in_16_bytes_is_its_octets_then_zeros() {
        assert_eq!(ipv4_in_16([10, 244, 1, 7]), [10, 244, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn host_veths_keep_their_layout() {
        assert_eq!(core::mem::size_of::<HostVeth>(), 40);
        assert!(HOST_VETHS_SLOTS.is_power_of_two());
        assert_eq!(host_veth_slot(HOST_VETHS_SLOTS + 7), 7);
    }

    #[test]
    fn v4_keys_are_the_fields_written_out() {
        let key = IpKey::v4([10, 244, 1, 7]);
        let spelled = IpKey { family: FAMILY_IPV4, pad: [0; 3], addr: ipv4_in_16([10, 244, 1, 7]) };
        assert_eq!(key, spelled);
    }
}
