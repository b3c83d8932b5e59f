//! Masquerade, the way out (called by `to_uplink`): pod → outside flows leave with the node's
//! address and a port of the configured range. The way back is `rev_snat.rs`.
//!
//! Each flow has two entries in `NAT`: the egress entry, keyed by the pod's packet, says which
//! node port it got; the reply entry, keyed by the reply as it arrives, says which pod and port
//! to restore. The reply entry is what reserves the port: inserting it with `BPF_NOEXIST` is
//! the atomic "is this port free for this destination" test, so two CPUs never hand out the same
//! port. Both entries carry the owner (for DEL) and the time of the last packet (for reuse).
use aya_ebpf::{bindings::BPF_ANY, helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{DatapathConfig, DropReason, NAT_EGRESS, NAT_REPLY, NatEntry, ipv4_in_16};

use crate::{
    flow::{self, Flow},
    maps, node_sockets, pod_flows,
    port_search::{PortSearch, SOCKET_SEARCHES},
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

/// A port for the flow that no socket of the node holds either (see `port_search.rs`).
#[inline(always)]
fn claim_free_port(
    ctx: &TcContext,
    flow: &Flow,
    config: &DatapathConfig,
    owner: u64,
    now: u64,
) -> Result<u16, DropReason> {
    let mut search = PortSearch::new(reply_key(flow, config.node_ipv4, 0), reply_entry(flow, owner, now), config);
    for _ in 0..SOCKET_SEARCHES {
        let port = search.next().ok_or(DropReason::NatPortsExhausted)?;
        if !node_sockets::hold(ctx, flow, config.node_ipv4, port) {
            return Ok(port);
        }
        search.give_back(port);
    }
    Err(DropReason::NatPortsExhausted)
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

/// The key a reply to the masqueraded flow arrives with: outside → node, ports swapped.
#[inline(always)]
fn reply_key(flow: &Flow, node_ipv4: [u8; 4], port: u16) -> ebpf_common::FlowKey {
    flow::key(flow.protocol, flow.dst, flow.dst_port, node_ipv4, port)
}
