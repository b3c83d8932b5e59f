//! Masquerade, the way out (called by `to_uplink`): pod → outside flows leave with the node's
//! address and a port of the configured range. The way back is `rev_snat.rs`.
//!
//! Each flow has two entries in `NAT`: the egress entry, keyed by the pod's packet, says which
//! node port it got; the reply entry, keyed by the reply as it arrives, says which pod and port
//! to restore. The reply entry is what reserves the port: inserting it with `BPF_NOEXIST` is
//! the atomic "is this port free for this destination" test, so two CPUs never hand out the same
//! port. Both entries carry the owner (valid for that attachment only) and the time of the last
//! packet (for reuse).
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{
    DatapathConfig, DropReason, NAT_CLOSING_BY_POD, NAT_CLOSING_PEER_RESET, NAT_EGRESS, NAT_REPLY, NatEntry, ipv4_in_16,
};

use crate::{
    flow::{self, Flow},
    maps, node_sockets, pod_flows,
    port_search::{PortSearch, SOCKET_SEARCHES},
    rewrite::{Side, rewrite},
    shares, steer,
};

/// What masquerade did with a pod's packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It leaves with the node's address and the flow's port.
    Masqueraded,
    /// A reply in a flow opened from outside towards the pod's own address: left as it is.
    OwnAddress,
}

/// Gives the pod's packet the node's address and the flow's port (allocated on its first
/// packet), unless it answers a flow opened from outside to the pod's address. A translation
/// the flow already has always wins over such a record, and a pod's SYN opens a flow of its
/// own whatever was recorded: a record made for a forged 5-tuple can neither take an existing
/// flow off masquerade nor a later one.
#[inline(always)]
pub fn masquerade(ctx: &TcContext, config: &DatapathConfig, flow: &Flow, owner: u64) -> Result<Outcome, DropReason> {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let port = match existing_port(flow, config, now, owner) {
        Some(port) => port,
        None if !flow.opens() && steer::answers_outside(&flow.key(), owner, flow.tcp_flags) => {
            return Ok(Outcome::OwnAddress);
        }
        None => allocate(ctx, flow, config, owner, now)?,
    };
    rewrite(ctx, flow, Side::Source, config.node_ipv4, port)?;
    Ok(Outcome::Masqueraded)
}

/// The port of a live flow of `owner`, if its reply entry still points back at this pod.
#[inline(always)]
fn existing_port(flow: &Flow, config: &DatapathConfig, now: u64, owner: u64) -> Option<u16> {
    let egress = maps::NAT.get_ptr_mut(flow.key())?;
    // SAFETY: an LRU value; a concurrent writer can only store another whole, valid entry.
    let port = unsafe { (*egress).port };
    let key = reply_key(flow, config.node_ipv4, port);
    let reply = maps::NAT.get_ptr_mut(&key)?;
    // SAFETY: as above.
    unsafe {
        // The port was taken over after the flow idled out, or the entries are of a deleted
        // pod that had this address (DEL leaves them to age).
        if (*reply).addr != ipv4_in_16(flow.src) || (*reply).port != flow.src_port || (*reply).owner != owner {
            return None;
        }
        // The pod ends the flow: it no longer counts in its share (its port frees 10 s later).
        if flow.closes() && (*reply).closing != NAT_CLOSING_BY_POD {
            shares::release(owner, &key);
        }
        touch_from_pod(egress, now, flow.closes());
        touch_from_pod(reply, now, flow.closes());
    }
    Some(port)
}

/// Resolution of `last_seen_ns`: timeouts are tens of seconds and more, so an entry is written
/// at most once a second rather than on every packet (a write moves its cache line to this CPU).
const TOUCH_EVERY_NS: u64 = 1_000_000_000;

/// Records that the flow is alive, unless that was recorded less than a second ago. The pod's
/// FIN or RST marks it closing for good; any other packet of the pod takes back a mark an
/// outside RST made (`NAT_CLOSING_PEER_RESET`).
///
/// # Safety
/// `entry` must point at a `NAT` value obtained in this program run.
#[inline(always)]
pub unsafe fn touch_from_pod(entry: *mut NatEntry, now: u64, closes: bool) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        refresh(entry, now);
        if closes {
            if (*entry).closing != NAT_CLOSING_BY_POD {
                (*entry).closing = NAT_CLOSING_BY_POD;
                (*entry).last_seen_ns = now;
            }
        } else if (*entry).closing == NAT_CLOSING_PEER_RESET {
            (*entry).closing = 0;
        }
    }
}

/// [`touch_from_pod`] for a reply from outside, before netfilter has seen it: it only says
/// the flow is alive. A RST marks the flow closing once the node's stack has accepted it and
/// hands it into the pod ([`peer_reset`], from `to_pod`): one sprayed at the node's ports with
/// a guessed sequence number is dropped by conntrack or answered by the pod's challenge ACK.
///
/// # Safety
/// As for [`touch_from_pod`].
#[inline(always)]
pub unsafe fn touch_from_peer(entry: *mut NatEntry, now: u64) {
    // SAFETY: guaranteed by the caller.
    unsafe { refresh(entry, now) };
}

/// A RST from outside of masqueraded flow `flow` (as delivered into the pod: translated back)
/// marks it closing until the pod's next packet shows it alive (`NAT_CLOSING_PEER_RESET`).
#[inline(always)]
pub fn peer_reset(flow: &Flow, config: &DatapathConfig) {
    // The pod's side names the node's port; the reply entry is what a port claim looks at.
    let Some(egress) = maps::NAT.get_ptr(&flow.reply_key()) else { return };
    // SAFETY: LRU values, valid while this program runs.
    unsafe {
        let key = flow::key(flow.protocol, flow.src, flow.src_port, config.node_ipv4, (*egress).port);
        let Some(reply) = maps::NAT.get_ptr_mut(&key) else { return };
        if (*reply).addr == ipv4_in_16(flow.dst) && (*reply).port == flow.dst_port && (*reply).closing == 0 {
            (*reply).closing = NAT_CLOSING_PEER_RESET;
            (*reply).last_seen_ns = bpf_ktime_get_ns();
        }
    }
}

/// # Safety
/// As for [`touch_from_pod`].
#[inline(always)]
unsafe fn refresh(entry: *mut NatEntry, now: u64) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if now.saturating_sub((*entry).last_seen_ns) >= TOUCH_EVERY_NS {
            (*entry).last_seen_ns = now;
        }
    }
}

/// Ports are 1–65535: 0 and these stand for the three reasons a new flow gets none.
const POD_LIMIT: u32 = 0x1_0000;
const POD_SHARE: u32 = 0x1_0001;

/// An allocation's outcome in one word (a port, or why none), for an allocation in a BPF
/// function of its own (`snat6.rs`: a BPF function returns one register).
#[inline(always)]
pub fn pack(allocated: Result<u16, DropReason>) -> u32 {
    match allocated {
        Ok(port) => u32::from(port),
        Err(DropReason::NatPodLimit) => POD_LIMIT,
        Err(DropReason::NatPodShare) => POD_SHARE,
        Err(_) => 0,
    }
}

/// [`pack`] undone.
#[inline(always)]
pub fn unpack(packed: u32) -> Result<u16, DropReason> {
    match packed {
        0 => Err(DropReason::NatPortsExhausted),
        POD_LIMIT => Err(DropReason::NatPodLimit),
        POD_SHARE => Err(DropReason::NatPodShare),
        port => Ok(port as u16),
    }
}

/// Finds a port for a new flow among random ones of the configured range and records both
/// entries. If the second cannot be written, the port claimed for the first is given back.
///
/// The egress entry goes in only if absent: when two CPUs handle a new flow's first packets at
/// once, one writes it and the other gives its port back and takes the winner's, so the flow
/// leaves from one port. An egress entry that is no live flow's (`existing_port` refused it:
/// taken over, or a deleted pod's) is removed first, and the insert is still only-if-absent.
#[inline(always)]
fn allocate(ctx: &TcContext, flow: &Flow, config: &DatapathConfig, owner: u64, now: u64) -> Result<u16, DropReason> {
    if !pod_flows::admit(owner, now, config.pod_flows_per_minute) {
        return Err(DropReason::NatPodLimit);
    }
    let share = reply_key(flow, config.node_ipv4, 0);
    if !shares::admit(owner, &share, config) {
        return Err(DropReason::NatPodShare);
    }
    let port = claim_free_port(ctx, flow, config, owner, now).inspect_err(|_| shares::release(owner, &share))?;
    let egress =
        NatEntry { addr: ipv4_in_16(config.node_ipv4), port, direction: NAT_EGRESS, ..reply_entry(flow, owner, now) };
    if maps::NAT.insert(&flow.key(), &egress, u64::from(BPF_NOEXIST)).is_err() {
        // A dead flow's entry is removed and the insert tried once more, still only if absent:
        // another CPU may be replacing it too, and then its port is the flow's.
        if existing_port(flow, config, now, owner).is_none() {
            let _ = maps::NAT.remove(&flow.key());
        }
        if maps::NAT.insert(&flow.key(), &egress, u64::from(BPF_NOEXIST)).is_err() {
            let _ = maps::NAT.remove(&reply_key(flow, config.node_ipv4, port));
            shares::release(owner, &share);
            return existing_port(flow, config, now, owner).ok_or(DropReason::NatPortsExhausted);
        }
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
