//! The benchmarks' floor: the least a program on the host veth's ingress can do to put a pod's
//! packet into another pod, with nothing looked up. It writes the MACs and redirects with
//! `bpf_redirect_peer` to the one target its load-time global names; IPv4 and IPv6 but
//! ICMPv6 only (ARP and neighbour discovery go on to the next filter, `from_pod`, so that the
//! pods still find their gateway). The bench loads it per host veth, in front of `from_pod`, to
//! measure what `from_pod`'s own work costs against it. The plugin never loads it.
use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::bpf_redirect_peer,
    programs::TcContext,
};
use ebpf_common::FloorTarget;
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv6Hdr,
};

use crate::packet;

/// Set by the bench (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static FLOOR_TARGET: FloorTarget = FloorTarget { ifindex: 0, dst_mac: [0; 6], src_mac: [0; 6] };

const PROTO_ICMPV6: u8 = 58;

#[inline(always)]
pub fn redirect(ctx: &TcContext) -> i32 {
    let Some(eth) = packet::header_mut::<EthHdr>(ctx, 0) else { return TC_ACT_SHOT as i32 };
    // SAFETY: bounds checked by `header_mut`.
    let ether_type = unsafe { (*eth).ether_type };
    let ip = ether_type == EtherType::Ipv4 as u16
        || ether_type == EtherType::Ipv6 as u16
            && packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN)
                .is_some_and(|ip| unsafe { (*ip).next_hdr } != PROTO_ICMPV6);
    if !ip {
        return TC_ACT_UNSPEC;
    }
    // Read in place, as `config::get` reads `CONFIG`: the compiler must not fold the zeros.
    let address: *const FloorTarget = &FLOOR_TARGET;
    // SAFETY: a plain global that nothing writes after load; `eth` bounds checked above.
    // Volatile stores: plain ones went through a `memmove` call (the compiler cannot tell that
    // the global and the packet do not overlap).
    unsafe {
        let target = &*core::ptr::read_volatile(&address);
        let (dst, src) = (target.dst_mac, target.src_mac);
        core::ptr::write_volatile(&mut (*eth).dst_addr, dst);
        core::ptr::write_volatile(&mut (*eth).src_addr, src);
        bpf_redirect_peer(target.ifindex, 0) as i32
    }
}
