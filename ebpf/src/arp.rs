//! ARP responder: a pod asking for any address other than its own gets the host-side veth's MAC.
//! That makes every destination, the gateway included, one hop away through `from_pod`, with no
//! bridge and no proxy-ARP sysctl in the node.
use aya_ebpf::{helpers::bpf_redirect, programs::TcContext};
use ebpf_common::{DropReason, ForwardPath, IpKey};
use network_types::{arp::ArpHdr, eth::EthHdr};

use crate::{maps, packet};

const OPER_REQUEST: u16 = 1;
const OPER_REPLY: u16 = 2;

pub fn handle(ctx: &TcContext, eth: *mut EthHdr) -> i32 {
    let Some(arp) = packet::header_mut::<ArpHdr>(ctx, EthHdr::LEN) else {
        return maps::drop(ctx, DropReason::Malformed);
    };
    // SAFETY: bounds checked by `header_mut`.
    let (arp, eth) = unsafe { (&mut *arp, &mut *eth) };
    let sender = arp.spa;
    // An ARP probe (sender 0.0.0.0) carries no claim; anything else must be the pod's own address.
    if sender == [0; 4] {
        return crate::packet::PASS;
    }
    let Some(own) = maps::endpoint(&IpKey::v4(sender)) else {
        return maps::drop(ctx, DropReason::SpoofedArp);
    };
    if own.host_ifindex != packet::ingress_ifindex(ctx) {
        return maps::drop(ctx, DropReason::SpoofedArp);
    }
    // Replies and gratuitous announcements (target == sender) go to the node's stack unchanged.
    if arp.oper() != OPER_REQUEST || arp.tpa == sender {
        return crate::packet::PASS;
    }
    let target = arp.tpa;
    arp.set_oper(OPER_REPLY);
    arp.tha = arp.sha;
    arp.tpa = sender;
    arp.sha = own.host_mac;
    arp.spa = target;
    eth.dst_addr = eth.src_addr;
    eth.src_addr = own.host_mac;
    // Back out of the same veth: its egress is the pod's ingress.
    // SAFETY: plain helper call.
    maps::forwarded(ctx, ForwardPath::Answered, unsafe { bpf_redirect(own.host_ifindex, 0) } as i32)
}
