//! IPv6 masquerade, both ways (`snat.rs` and `rev_snat.rs` for IPv4, whose `NAT` entries,
//! port claims, timeouts and per-pod limit these share): a pod's flow to outside the cluster
//! leaves with the node's IPv6 address and a port of the range; its replies get the pod's
//! address and port back and go on into the node's stack.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{DatapathConfig, DropReason, ForwardPath, IpKey, NAT_EGRESS, NAT_REPLY, NatEntry};

use crate::{
    flow6::{self, Flow6},
    maps, node_echoes, node_sockets, packet, pod_flows,
    port_search::{PortSearch, SOCKET_SEARCHES},
    rewrite::Side,
    rewrite6::rewrite,
    shares,
    snat::{self, Outcome},
    steer,
};

/// `snat::peer_reset` for IPv6.
#[inline(always)]
pub fn peer_reset(flow: &Flow6, config: &DatapathConfig) {
    let Some(egress) = maps::NAT.get_ptr(&flow.reply_key()) else { return };
    // SAFETY: LRU values, valid while this program runs.
    unsafe {
        let k = &flow.key;
        let key = flow6::key(k.protocol, k.src_addr, k.src_port, config.node_ipv6, (*egress).port);
        let Some(reply) = maps::NAT.get_ptr_mut(&key) else { return };
        if (*reply).addr == k.dst_addr && (*reply).port == k.dst_port && (*reply).closing == 0 {
            (*reply).closing = ebpf_common::NAT_CLOSING_PEER_RESET;
            (*reply).last_seen_ns = bpf_ktime_get_ns();
        }
    }
}

/// Gives the pod's packet the node's IPv6 address and the flow's port, unless it answers a flow
/// opened from outside to the pod's address (the same rules as `snat::masquerade`).
#[inline(always)]
pub fn masquerade(ctx: &TcContext, config: &DatapathConfig, flow: &Flow6, owner: u64) -> Result<Outcome, DropReason> {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let port = match existing_port(flow, config, now, owner, false) {
        Some(port) => port,
        None if !flow.opens() && steer::answers_outside(&flow.key, owner, flow.tcp_flags) => {
            return Ok(Outcome::OwnAddress);
        }
        None => allocate_counted(ctx, flow, config, owner, now)?,
    };
    rewrite(ctx, flow, Side::Source, &config.node_ipv6, port)?;
    Ok(Outcome::Masqueraded)
}

/// A reply to the node's IPv6 address: translated back if it belongs to a masqueraded flow.
/// A BPF function of its own, as `icmp_error6::translate` is: `from_uplink6` calls one or the
/// other, and each fits the stack beside it.
#[inline(never)]
pub fn reply(ctx: &TcContext, config: &DatapathConfig) -> i32 {
    // Anything without ports is the node's (ICMPv6 errors went to `icmp_error6`).
    let Ok(flow) = Flow6::parse(ctx) else { return packet::PASS };
    if !config.is_masq_port(flow.key.dst_port) {
        return packet::PASS;
    }
    // The node's own ping's reply, whichever pod's flow has the identifier too.
    if node_echoes::holds(&flow.key) {
        return packet::PASS;
    }
    let Some(entry) = maps::NAT.get_ptr_mut(&flow.key) else { return packet::PASS };
    // SAFETY: an LRU value, valid while this program runs; read in place (a copy costs stack).
    let (pod, port, owner) = unsafe { (&(*entry).addr, (*entry).port, (*entry).owner) };
    // A deleted pod's flow (DEL leaves its entries to age): not for the pod that has its
    // address now.
    if maps::ENDPOINTS.get_ptr(&IpKey::v6(*pod)).is_none_or(|e| unsafe { (*e).owner } != owner) {
        return packet::PASS;
    }
    // SAFETY: as above.
    unsafe { snat::touch_from_peer(entry, bpf_ktime_get_ns()) };
    if let Err(reason) = rewrite(ctx, &flow, Side::Destination, pod, port) {
        return maps::drop(ctx, reason);
    }
    maps::forwarded(ctx, ForwardPath::ReplyToPod, packet::PASS)
}

#[inline(always)]
fn existing_port(flow: &Flow6, config: &DatapathConfig, now: u64, owner: u64, in_search: bool) -> Option<u16> {
    let egress = maps::NAT.get_ptr_mut(&flow.key)?;
    // SAFETY: an LRU value; a concurrent writer can only store another whole, valid entry.
    let port = unsafe { (*egress).port };
    let reply = maps::NAT.get_ptr_mut(&reply_key(flow, config, port))?;
    // SAFETY: as above.
    unsafe {
        if (*reply).addr != flow.key.src_addr || (*reply).port != flow.key.src_port || (*reply).owner != owner {
            return None;
        }
        // As `snat::existing_port`: a flow the pod ends leaves its share. Not from the port
        // search's frame (`in_search`, a constant there), where one frame more does not fit.
        if !in_search && flow.closes() && (*reply).closing != ebpf_common::NAT_CLOSING_BY_POD {
            release_closed(owner, flow, config, port);
        }
        snat::touch_from_pod(egress, now, flow.closes());
        snat::touch_from_pod(reply, now, flow.closes());
    }
    Some(port)
}

/// A new flow's port, counted in the pod's shares (`shares.rs`) from this frame: called from
/// the port search's frame, the share's would not fit the 512-byte stack.
#[inline(always)]
fn allocate_counted(
    ctx: &TcContext,
    flow: &Flow6,
    config: &DatapathConfig,
    owner: u64,
    now: u64,
) -> Result<u16, DropReason> {
    let share = reply_key(flow, config, 0);
    if !shares::admit(owner, &share, config) {
        return Err(DropReason::NatPodShare);
    }
    snat::unpack(allocate_apart(ctx, flow, config, owner, now)).inspect_err(|_| shares::release(owner, &share))
}

/// The pod closed `flow`: it leaves its share. A BPF function of its own, so that the key it
/// builds never sits on the per-packet path's frame.
#[inline(never)]
fn release_closed(owner: u64, flow: &Flow6, config: &DatapathConfig, port: u16) {
    shares::release(owner, &reply_key(flow, config, port));
}

/// [`allocate`] in a BPF function of its own, as `snat::allocate_apart`.
#[inline(never)]
fn allocate_apart(ctx: &TcContext, flow: &Flow6, config: &DatapathConfig, owner: u64, now: u64) -> u32 {
    snat::pack(allocate(ctx, flow, config, owner, now))
}

#[inline(always)]
fn allocate(ctx: &TcContext, flow: &Flow6, config: &DatapathConfig, owner: u64, now: u64) -> Result<u16, DropReason> {
    if !pod_flows::admit(owner, now, config.pod_flows_per_minute) {
        return Err(DropReason::NatPodLimit);
    }
    let port = match claim_free_port(ctx, flow, config, owner, now) {
        0 => return Err(DropReason::NatPortsExhausted),
        port => port,
    };
    let egress = NatEntry { addr: config.node_ipv6, port, direction: NAT_EGRESS, ..reply_entry(flow, owner, now) };
    // As `snat::allocate`: the first of two CPUs wins, a dead flow's entry is replaced.
    // As `snat::allocate`. The flow is counted twice when another CPU won (it counted it too),
    // until the agent's recount.
    if maps::NAT.insert(&flow.key, &egress, u64::from(BPF_NOEXIST)).is_err() {
        if existing_port(flow, config, now, owner, true).is_none() {
            let _ = maps::NAT.remove(&flow.key);
        }
        if maps::NAT.insert(&flow.key, &egress, u64::from(BPF_NOEXIST)).is_err() {
            let _ = maps::NAT.remove(&reply_key(flow, config, port));
            return existing_port(flow, config, now, owner, true).ok_or(DropReason::NatPortsExhausted);
        }
    }
    aya_log_ebpf::info!(
        ctx,
        "masquerade: new flow [{:i}]:{} -> [{:i}]:{} proto {} leaves from port {}",
        flow.key.src_addr,
        flow.key.src_port,
        flow.key.dst_addr,
        flow.key.dst_port,
        flow.key.protocol,
        port
    );
    Ok(port)
}

/// As `snat::claim_free_port`.
#[inline(always)]
fn claim_free_port(ctx: &TcContext, flow: &Flow6, config: &DatapathConfig, owner: u64, now: u64) -> u16 {
    let mut search = PortSearch::new(reply_key(flow, config, 0), reply_entry(flow, owner, now), config);
    for _ in 0..SOCKET_SEARCHES {
        let Some(port) = search.next() else { return 0 };
        if !node_sockets::hold6(ctx, flow, &config.node_ipv6, port) {
            return port;
        }
        search.give_back(port);
    }
    0
}

#[inline(always)]
fn reply_entry(flow: &Flow6, owner: u64, now: u64) -> NatEntry {
    NatEntry {
        addr: flow.key.src_addr,
        port: flow.key.src_port,
        direction: NAT_REPLY,
        closing: 0,
        pad: [0; 4],
        owner,
        last_seen_ns: now,
    }
}

/// The key a reply arrives with: outside → node, ports swapped.
#[inline(always)]
fn reply_key(flow: &Flow6, config: &DatapathConfig, port: u16) -> ebpf_common::FlowKey {
    let k = &flow.key;
    flow6::key(k.protocol, k.dst_addr, k.dst_port, config.node_ipv6, port)
}
