//! Masquerade, the way out (called by `to_uplink`): pod → outside flows leave with the node's
//! address and a port of the configured range. The way back is `rev_snat.rs`.
//!
//! Each flow has two entries in `NAT`: the egress entry, keyed by the pod's packet, says which
//! node port it got; the reply entry, keyed by the reply as it arrives, says which pod and port
//! to restore. The reply entry is what reserves the port: inserting it with `BPF_NOEXIST` is
//! the atomic "is this port free for this destination" test, so two CPUs never hand out the same
//! port. Both entries carry the owner (for DEL) and the time of the last packet (for reuse).
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    cty::c_void,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_loop},
    programs::TcContext,
};
use ebpf_common::{
    DatapathConfig, DropReason, NAT_EGRESS, NAT_PORT_TRIES, NAT_REPLY, NAT_TIMEOUT_ICMP_NS, NAT_TIMEOUT_TCP_CLOSING_NS,
    NAT_TIMEOUT_TCP_NS, NAT_TIMEOUT_UDP_NS, NatEntry, ipv4_in_16,
};

use crate::{
    flow::{self, Flow, PROTO_ICMP, PROTO_TCP},
    maps, node_sockets, pod_flows,
    rewrite::{Side, rewrite},
};

/// Gives the pod's packet the node's address and the flow's port (allocated on its first packet).
#[inline(always)]
pub fn masquerade(ctx: &TcContext, config: &DatapathConfig, flow: &Flow, owner: u64) -> Result<(), DropReason> {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let port = match existing_port(flow, config, now) {
        Some(port) => port,
        None => allocate(ctx, flow, config, owner, now)?,
    };
    rewrite(ctx, flow, Side::Source, config.node_ipv4, port)
}

/// The port of a live flow, if its reply entry still points back at this pod.
#[inline(always)]
fn existing_port(flow: &Flow, config: &DatapathConfig, now: u64) -> Option<u16> {
    let egress = maps::NAT.get_ptr_mut(flow.key())?;
    // SAFETY: an LRU value; a concurrent writer can only store another whole, valid entry.
    let port = unsafe { (*egress).port };
    let reply = maps::NAT.get_ptr_mut(reply_key(flow, config.node_ipv4, port))?;
    // SAFETY: as above.
    unsafe {
        if (*reply).addr != ipv4_in_16(flow.src) || (*reply).port != flow.src_port {
            return None; // the port was taken over after the flow idled out
        }
        touch(egress, now, flow.closes());
        touch(reply, now, flow.closes());
    }
    Some(port)
}

/// Resolution of `last_seen_ns`: timeouts are tens of seconds and more, so an entry is written
/// at most once a second rather than on every packet (a write moves its cache line to this CPU).
const TOUCH_EVERY_NS: u64 = 1_000_000_000;

/// Records that the flow is alive, unless that was recorded less than a second ago, and that
/// it is closing when this packet ends it (FIN, RST).
///
/// # Safety
/// `entry` must point at a `NAT` value obtained in this program run.
#[inline(always)]
pub unsafe fn touch(entry: *mut NatEntry, now: u64, closes: bool) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if now.saturating_sub((*entry).last_seen_ns) >= TOUCH_EVERY_NS {
            (*entry).last_seen_ns = now;
        }
        if closes && (*entry).closing == 0 {
            (*entry).closing = 1;
            (*entry).last_seen_ns = now;
        }
    }
}

/// Finds a port for a new flow among random ones of the configured range and records both
/// entries. If the second cannot be written, the port claimed for the first is given back.
#[inline(always)]
fn allocate(ctx: &TcContext, flow: &Flow, config: &DatapathConfig, owner: u64, now: u64) -> Result<u16, DropReason> {
    if !pod_flows::admit(owner, now, config.pod_flows_per_minute) {
        return Err(DropReason::NatPodLimit);
    }
    let port = claim_free_port(ctx, flow, config, owner, now)?;
    let egress =
        NatEntry { addr: ipv4_in_16(config.node_ipv4), port, direction: NAT_EGRESS, ..reply_entry(flow, owner, now) };
    if maps::NAT.insert(&flow.key(), &egress, u64::from(BPF_ANY)).is_err() {
        let _ = maps::NAT.remove(&reply_key(flow, config.node_ipv4, port));
        return Err(DropReason::NatPortsExhausted);
    }
    aya_log_ebpf::info!(
        ctx,
        "masquerade: new flow {:i}:{} -> {:i}:{} proto {} leaves from port {}",
        flow.src,
        flow.src_port,
        flow.dst,
        flow.dst_port,
        flow.protocol,
        port
    );
    Ok(port)
}

/// Searches for a port until one is claimed that no socket of the node holds either; a port a
/// socket holds is given back (it was free in `NAT`, or idle) and the next search leaves it
/// out, so a range with one free port among socket-held ones always finds it when the held
/// one comes up first. Each search ends at its first claim: with a share `f` of a large range
/// held by node sockets a new flow fails with probability about `f` to the power of
/// `SOCKET_SEARCHES`.
#[inline(always)]
fn claim_free_port(
    ctx: &TcContext,
    flow: &Flow,
    config: &DatapathConfig,
    owner: u64,
    now: u64,
) -> Result<u16, DropReason> {
    let mut held_by_socket = None;
    for _ in 0..SOCKET_SEARCHES {
        let port = random_port(flow, config, owner, now, held_by_socket).ok_or(DropReason::NatPortsExhausted)?;
        if !node_sockets::hold(ctx, flow, config.node_ipv4, port) {
            return Ok(port);
        }
        let _ = maps::NAT.remove(&reply_key(flow, config.node_ipv4, port));
        held_by_socket = Some(port);
    }
    Err(DropReason::NatPortsExhausted)
}

const SOCKET_SEARCHES: usize = 4;

/// What one random try needs, by value and compact (the callback's frame and the caller's
/// share the 512-byte stack): `bpf_loop` hands the callback a pointer to it.
struct PortSearch {
    flow: Flow,
    node_ipv4: [u8; 4],
    port_min: u16,
    /// The claimed port, 0 while none is.
    found: u16,
    span: u32,
    /// The offset in the range of a port this search leaves out, `span` for none.
    skip: u32,
    owner: u64,
    now: u64,
}

/// Up to `NAT_PORT_TRIES` random ports of the range, through `bpf_loop`: the verifier checks
/// the callback once, where an open-coded loop made it walk every iteration into everything
/// after it (114,399 instructions verified, ~90 ms of every first load, against 3,279).
#[inline(always)]
fn random_port(flow: &Flow, config: &DatapathConfig, owner: u64, now: u64, skip: Option<u16>) -> Option<u16> {
    let span = u32::from(config.port_max.saturating_sub(config.port_min)) + 1;
    let mut search = PortSearch {
        flow: *flow,
        node_ipv4: config.node_ipv4,
        port_min: config.port_min,
        found: 0,
        span,
        skip: skip.map_or(span, |port| u32::from(port.wrapping_sub(config.port_min))),
        owner,
        now,
    };
    let context: *mut PortSearch = &mut search;
    // SAFETY: the callback only reads and writes `search`, which outlives the call.
    unsafe { bpf_loop(NAT_PORT_TRIES, try_random_port as *mut c_void, context.cast(), 0) };
    (search.found != 0).then_some(search.found)
}

/// One try of [`random_port`]; returns 1 (stop) once a port is claimed. The first half of the
/// tries take only ports no flow holds: a port another flow left idle (or closed, 10 s ago) is
/// taken only when free ones are scarce, so a new connection rarely reuses a recent 4-tuple
/// (the server may still hold it in TIME_WAIT).
extern "C" fn try_random_port(index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `random_port` passes its `PortSearch`, alive for the whole `bpf_loop` call.
    let search = unsafe { &mut *context.cast::<PortSearch>() };
    // SAFETY: plain helper call.
    let random = unsafe { bpf_get_prandom_u32() };
    // The skipped port is left out by drawing among one port fewer and stepping over it.
    let choices = search.span - u32::from(search.skip < search.span);
    if choices == 0 {
        return 1;
    }
    let mut offset = random % choices;
    if offset >= search.skip {
        offset += 1;
    }
    let candidate = search.port_min.wrapping_add(offset as u16);
    let reply = reply_entry(&search.flow, search.owner, search.now);
    let take_idle = index >= u64::from(NAT_PORT_TRIES / 2);
    if claim(&search.flow, search.node_ipv4, candidate, &reply, search.now, take_idle) {
        search.found = candidate;
        return 1;
    }
    0
}

/// The reply entry of a new flow: what a reply's destination is rewritten back to.
#[inline(always)]
fn reply_entry(flow: &Flow, owner: u64, now: u64) -> NatEntry {
    NatEntry {
        addr: ipv4_in_16(flow.src),
        port: flow.src_port,
        direction: NAT_REPLY,
        closing: 0,
        pad: [0; 4],
        owner,
        last_seen_ns: now,
    }
}

/// Takes `port` for the flow unless a live flow of another pod holds it (or an idle one, unless
/// `take_idle`). A port that is free is looked up before it is inserted: an insert that fails
/// on a full LRU map has already evicted another flow's entry to make room.
#[inline(always)]
fn claim(flow: &Flow, node_ipv4: [u8; 4], port: u16, reply: &NatEntry, now: u64, take_idle: bool) -> bool {
    // ICMP identifiers and ports are never 0 on the wire for a real flow.
    if port == 0 {
        return false;
    }
    let key = reply_key(flow, node_ipv4, port);
    let Some(held) = maps::NAT.get_ptr(&key) else {
        return maps::NAT.insert(&key, reply, u64::from(BPF_NOEXIST)).is_ok();
    };
    // SAFETY: an LRU value, read field by field (a copy would cost stack the callback of
    // `random_port` does not have).
    let (ours, last_seen, closing) =
        unsafe { ((*held).addr == reply.addr && (*held).port == reply.port, (*held).last_seen_ns, (*held).closing) };
    let idle = take_idle && now.saturating_sub(last_seen) > timeout(flow.protocol, closing != 0);
    if !(ours || idle) {
        return false;
    }
    // Deleted, then inserted only if still absent: of two CPUs taking the same idle port, one
    // wins (overwriting in place would let both believe they had it).
    let _ = maps::NAT.remove(&key);
    maps::NAT.insert(&key, reply, u64::from(BPF_NOEXIST)).is_ok()
}

/// The key a reply to the masqueraded flow arrives with: outside → node, ports swapped.
#[inline(always)]
fn reply_key(flow: &Flow, node_ipv4: [u8; 4], port: u16) -> ebpf_common::FlowKey {
    flow::key(flow.protocol, flow.dst, flow.dst_port, node_ipv4, port)
}

#[inline(always)]
fn timeout(protocol: u8, closing: bool) -> u64 {
    match protocol {
        PROTO_TCP if closing => NAT_TIMEOUT_TCP_CLOSING_NS,
        PROTO_TCP => NAT_TIMEOUT_TCP_NS,
        PROTO_ICMP => NAT_TIMEOUT_ICMP_NS,
        _ => NAT_TIMEOUT_UDP_NS,
    }
}
