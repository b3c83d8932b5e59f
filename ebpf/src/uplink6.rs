//! IPv6 on the uplink: `to_uplink6` and `from_uplink6`, programs of their own beside the IPv4
//! ones (each program has the 512-byte stack to itself, and IPv4's masquerade needs nearly all
//! of it), attached only for networks with IPv6 addresses. The same rules as IPv4's
//! (`to_uplink.rs`, `from_uplink.rs`): the fast path's packets go as they are, flows the stack
//! sent to other nodes are recorded (`steer.rs`), another node's pods reach ours straight,
//! masquerade to outside the cluster (`snat6.rs`), flows opened from outside towards a pod's
//! own address keep that address (`to_pod` records them), and a source of this node's pods
//! arriving from the LAN is forged (`SpoofedUplinkSource`).
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, ENDPOINT_LINK_LOCAL, FAST_PATH_MARK, ForwardPath, IpKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{
    config, deliver, flow, flow6::Flow6, icmp_error6, ipv6, maps, node_echoes, packet, policy, snat::Outcome, snat6,
    stack_epoch, steer,
};

/// Source and destination of the IPv6 packet in hand, read in place (copies would cost stack).
#[inline(always)]
fn addresses(ctx: &TcContext) -> Option<(&[u8; 16], &[u8; 16])> {
    let ip = packet::header_mut::<Ipv6Hdr>(ctx, EthHdr::LEN)?;
    // SAFETY: bounds checked by `header_mut`; the packet is not changed while these are used.
    unsafe { Some((&(*ip).src_addr, &(*ip).dst_addr)) }
}

/// `to_uplink6`: what `to_uplink` is for IPv4. Anything but IPv6 is `to_uplink`'s.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> i32 {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    if !flow::is_ipv6(ctx) || unsafe { (*ctx.skb.skb).mark } == FAST_PATH_MARK {
        return packet::PASS;
    }
    let config = config::get();
    let Some((src, dst)) = addresses(ctx) else { return packet::PASS };
    if config.in_node_pods6(dst) {
        return maps::drop(ctx, DropReason::NotAPod);
    }
    if config.masquerades6() && *src == config.node_ipv6 {
        if let Ok(flow) = Flow6::parse(ctx) {
            node_echoes::note6(&flow, config.port_min, config.port_max);
        }
        return packet::PASS;
    }
    if !config.in_cluster6(src) || ipv6::is_link_scope(dst) {
        return packet::PASS;
    }
    let Some(pod) = maps::ENDPOINTS.get_ptr_mut(&IpKey::v6(*src)) else { return packet::PASS };
    // SAFETY: a hash map value, valid while this program runs.
    let (owner, flags) = unsafe { ((*pod).owner, (*pod).flags) };
    if flags & ENDPOINT_LINK_LOCAL != 0 {
        return packet::PASS;
    }
    // NetworkPolicy: the pod's egress, after the stack's translation (`policy/`).
    if !policy::forwarded_egress_allowed(ctx) {
        return maps::drop(ctx, DropReason::PolicyDenied);
    }
    // To another node's pod through the stack (a Service's remote endpoint): its replies must
    // take the stack too (`steer.rs`).
    if config.in_cluster6(dst) {
        if let Ok(flow) = Flow6::parse(ctx) {
            // Both ways, as `to_uplink` records them.
            steer::record_stack(&flow.reply_key(), owner, flow.tcp_flags, true);
            steer::record_stack(&flow.key, owner, flow.tcp_flags, true);
            // SAFETY: as above.
            unsafe { stack_epoch::mark(pod) };
        }
        return packet::PASS;
    }
    if !config.masquerades6() {
        return packet::PASS;
    }
    let flow = match Flow6::parse(ctx) {
        Ok(flow) => flow,
        Err(reason) => return maps::drop(ctx, reason),
    };
    match snat6::masquerade(ctx, config, &flow, owner) {
        Ok(Outcome::Masqueraded) => maps::forwarded(ctx, ForwardPath::Masqueraded, packet::PASS),
        Ok(Outcome::OwnAddress) => maps::forwarded(ctx, ForwardPath::NotMasqueraded, packet::PASS),
        Err(reason) => maps::drop(ctx, reason),
    }
}

/// `from_uplink6`: what `from_uplink` is for IPv4.
#[inline(always)]
pub fn ingress(ctx: &TcContext) -> i32 {
    if !flow::is_ipv6(ctx) {
        return packet::PASS;
    }
    let config = config::get();
    let Some((src, dst)) = addresses(ctx) else { return packet::PASS };
    // Not link-local sources: the pods' link-local entries are theirs on their own links only,
    // and a pod asking for a MAC whose EUI-64 is a LAN router's would cut the node off from it.
    // As for IPv4, the endpoint lookup only for cluster sources.
    let pod_source =
        config.in_node_pods6(src) || config.in_cluster6(src) && maps::ENDPOINTS.get_ptr(&IpKey::v6(*src)).is_some();
    if !ipv6::is_link_scope(src) && pod_source {
        return maps::drop(ctx, DropReason::SpoofedUplinkSource);
    }
    if config.masquerades6() && *dst == config.node_ipv6 {
        if icmp_error6::is_error(ctx) {
            return icmp_error6::translate(ctx, config);
        }
        return snat6::reply(ctx, config);
    }
    let Some(pod) = maps::endpoint(&IpKey::v6(*dst)).filter(|e| e.flags & ENDPOINT_LINK_LOCAL == 0) else {
        return packet::PASS;
    };
    if !config.in_cluster6(src) {
        return maps::forwarded(ctx, ForwardPath::UplinkToStack, packet::PASS);
    }
    // Untrusted: a SYN from here forgets nothing (`steer::via_stack`).
    if steer::via_stack6(ctx, stack_epoch::live(&pod), pod.owner, false) {
        return maps::forwarded(ctx, ForwardPath::UplinkToStack, packet::PASS);
    }
    deliver::into_pod(ctx, &pod, ForwardPath::FromOtherNode)
}
