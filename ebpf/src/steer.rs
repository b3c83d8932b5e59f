//! Which way a flow goes. The fast paths (`bpf_redirect_peer` into a pod, the FIB redirect to
//! another node) skip the node's netfilter; conntrack must see either every packet of a flow or
//! none, or kube-proxy's `--ctstate INVALID -j DROP` drops the rest and its DNAT is never undone.
//! So a flow takes a fast path only if the stack never handled it: where the stack hands a
//! packet on to a pod (`to_pod`) or to another node (`to_uplink`), the key its replies will have
//! is recorded in `FLOWS`; where a reply could take a fast path (`from_pod`, `from_uplink`), it
//! is looked up. Flows the stack never saw (plain pod ↔ pod) are never recorded: a pod gets its
//! lookups only while the stack has handed it such flows (`stack_epoch.rs`), so pods that serve
//! or use no Service pay nothing, and a pod that did pays nothing again once those flows are gone.
//!
//! Entries are created only where the node's stack has accepted the packet (`to_pod`,
//! `to_uplink`: after netfilter), never where a packet merely arrives (`from_uplink`), and each
//! is valid for one owner only (the attachment of the local pod the key involves): the pod
//! given a deleted pod's address never inherits its flows, so DEL need not purge them.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{
    FLOW_CONFIRM_WINDOW_NS, FLOW_CONFIRMED, FLOW_FIN, FLOW_FROM_OUTSIDE, FLOW_RST, FLOW_VIA_STACK, FlowEntry, FlowKey,
    flow_closing_bits, flow_timeout,
};

use crate::{
    flow::{Flow, PROTO_TCP, TCP_ACK, TCP_SYN},
    flow6::Flow6,
    icmp_error, icmp_error6, maps,
};

/// Written at most this often: a write moves the entry's cache line to this CPU.
const TOUCH_EVERY_NS: u64 = 1_000_000_000;

/// Records that packets keyed `key` (the replies of the packet in hand) belong to a flow with
/// `flag`. Written only when missing or a second old: not every packet of a Service flow writes.
#[inline(always)]
pub fn record(key: &FlowKey, owner: u64, flag: u32) {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = maps::FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value, valid while this program runs; a lost race only repeats a write.
        unsafe {
            // Another attachment's (a deleted pod whose address was given again): replaced.
            if (*entry).owner != owner {
                *entry = FlowEntry { owner, last_seen_ns: now, flags: flag, pad: 0 };
                return;
            }
            if (*entry).flags & flag != flag {
                (*entry).flags |= flag;
            }
            touch(entry, now);
        }
        return;
    }
    let entry = FlowEntry { owner, last_seen_ns: now, flags: flag, pad: 0 };
    // A concurrent insert of the same key wins; the LRU makes room when the map is full.
    let _ = maps::FLOWS.insert(key, &entry, u64::from(BPF_NOEXIST));
}

/// Records that the stack accepted a packet (TCP flags `tcp_flags`) of a flow whose packets
/// keyed `key` must take the stack too ([`FLOW_VIA_STACK`]). A SYN opening a new connection on
/// the same 5-tuple gives the entry its full life again. When the packet is `owner`'s pod's own
/// (`own`: on its way out, `to_uplink`), its FIN or RST shortens the entry's life to conntrack's
/// (`FLOW_FIN`, `FLOW_RST`); the peer's never does: conntrack lets through, as INVALID, a FIN or
/// RST out of the connection's window, and one forged from the LAN must not end an idle Service
/// connection's entry. The pod answers a peer's close with its own FIN, or a RST, and that marks.
#[inline(always)]
pub fn record_stack(key: &FlowKey, owner: u64, tcp_flags: u8, own: bool) {
    let opens = key.protocol == PROTO_TCP && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    if opens && let Some(entry) = maps::FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value, valid while this program runs.
        unsafe {
            if (*entry).owner == owner && (*entry).flags & (FLOW_FIN | FLOW_RST) != 0 {
                (*entry).flags &= !(FLOW_FIN | FLOW_RST);
            }
        }
    }
    let closing = if own { flow_closing_bits(key.protocol, tcp_flags) } else { 0 };
    record(key, owner, FLOW_VIA_STACK | closing);
}

/// Whether a live flow entry with `flag` exists for `key` and `owner`'s pod (one idle past its
/// protocol's timeout is not: its 5-tuple may have been reused since; nor one of another
/// attachment that had the pod's address before). A hit keeps the entry alive.
#[inline(always)]
pub fn has(key: &FlowKey, flag: u32, owner: u64) -> bool {
    has_closing(key, flag, owner, 0)
}

/// [`has`], and a hit takes `closing` (`FLOW_FIN`, `FLOW_RST`: the pod's own segment ends the
/// flow; never a packet from the uplink, which anyone may forge).
#[inline(always)]
fn has_closing(key: &FlowKey, flag: u32, owner: u64, closing: u32) -> bool {
    let Some(entry) = maps::FLOWS.get_ptr_mut(key) else { return false };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        let flags = (*entry).flags;
        if (*entry).owner != owner
            || flags & flag == 0
            || now.saturating_sub((*entry).last_seen_ns) > flow_timeout(key.protocol, flags)
        {
            return false;
        }
        if flags & closing != closing {
            (*entry).flags = flags | closing;
        }
        touch(entry, now);
    }
    true
}

/// Records that the stack accepted a packet opening a flow from outside the cluster towards
/// `owner`'s pod (`to_pod`), keyed by the pod's replies. A TCP SYN starts the flow afresh: an
/// old confirmation on the same 5-tuple is forgotten, and the pod's SYN-ACK must confirm again.
#[inline(always)]
pub fn record_from_outside(key: &FlowKey, owner: u64, syn: bool) {
    if syn && let Some(entry) = maps::FLOWS.get_ptr_mut(key) {
        // SAFETY: an LRU value, valid while this program runs.
        unsafe {
            if (*entry).owner == owner && (*entry).flags & FLOW_CONFIRMED != 0 {
                (*entry).flags &= !FLOW_CONFIRMED;
            }
        }
    }
    record(key, owner, FLOW_FROM_OUTSIDE);
}

/// Whether `owner`'s pod's packet keyed `key` (TCP flags `tcp_flags`) answers a flow opened from
/// outside towards its own address, so it keeps that address. A confirmed record within its
/// protocol's timeout says so; an unconfirmed one only for the pod's first answer: its SYN-ACK,
/// or for UDP and echo any packet within `FLOW_CONFIRM_WINDOW_NS` of the outside's last, which
/// then confirms it.
#[inline(always)]
pub fn answers_outside(key: &FlowKey, owner: u64, tcp_flags: u8) -> bool {
    let Some(entry) = maps::FLOWS.get_ptr_mut(key) else { return false };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        let (flags, idle) = ((*entry).flags, now.saturating_sub((*entry).last_seen_ns));
        if (*entry).owner != owner || flags & FLOW_FROM_OUTSIDE == 0 {
            return false;
        }
        if flags & FLOW_CONFIRMED == 0 {
            let syn_ack = TCP_SYN | TCP_ACK;
            if idle > FLOW_CONFIRM_WINDOW_NS || key.protocol == PROTO_TCP && tcp_flags & syn_ack != syn_ack {
                return false;
            }
            (*entry).flags = flags | FLOW_CONFIRMED;
        } else if idle > flow_timeout(key.protocol, flags) {
            return false;
        }
        touch(entry, now);
    }
    true
}

/// Whether `owner`'s pod's ICMP error about the flow `key` (the quoted packet's reply, the way
/// the error travels) is about a flow opened from outside towards its own address, as
/// [`answers_outside`] would say of a reply (a port unreachable is often a pod's only answer).
/// Read only: an error neither confirms nor refreshes the record.
#[inline(always)]
pub fn errs_on_outside_flow(key: &FlowKey, owner: u64) -> bool {
    // SAFETY: copied at once.
    let Some(entry) = (unsafe { maps::FLOWS.get(key).copied() }) else { return false };
    // SAFETY: plain helper call.
    let idle = unsafe { bpf_ktime_get_ns() }.saturating_sub(entry.last_seen_ns);
    let window = if entry.flags & FLOW_CONFIRMED == 0 {
        FLOW_CONFIRM_WINDOW_NS
    } else {
        flow_timeout(key.protocol, entry.flags)
    };
    entry.owner == owner && entry.flags & FLOW_FROM_OUTSIDE != 0 && idle <= window
}

/// # Safety
/// `entry` must point at a `FLOWS` value obtained in this program run.
#[inline(always)]
unsafe fn touch(entry: *mut FlowEntry, now: u64) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if now.saturating_sub((*entry).last_seen_ns) >= TOUCH_EVERY_NS {
            (*entry).last_seen_ns = now;
        }
    }
}

/// Whether a packet about to take a fast path must go through the stack instead. Only asked
/// when a pod involved is flagged (`flagged`); otherwise no flow of it was ever recorded.
///
/// Through the stack: a packet of a recorded flow (an ICMP error: of the flow it quotes), and
/// one without ports to tell its flow by (a fragment, another protocol), which might belong to
/// one. All fragments alike: the stack reassembles a datagram only when it sees all of them,
/// and conntrack takes a datagram it never saw for a new flow, not an invalid one.
///
/// A TCP SYN from a pod (`from_pod`: `trusted`, its source checked) opens a new connection:
/// whatever was recorded under its addresses and ports, both ways, belongs to an old one of the
/// same pod and is forgotten, and the new connection takes the fast path. A SYN from the uplink
/// forgets nothing: anyone on the LAN can send one with another node's pod's address, and
/// would make a live Service flow's replies skip the stack that undoes its translation. It goes
/// through the stack when either way of its 5-tuple is recorded, so that conntrack sees the
/// new connection's SYN as well as the replies the old record sends it.
#[inline(always)]
pub fn via_stack(ctx: &TcContext, flagged: bool, owner: u64, trusted: bool) -> bool {
    if !flagged {
        return false;
    }
    match Flow::parse(ctx) {
        Ok(flow) if flow.first_fragment => true,
        Ok(flow) if trusted && flow.opens() => {
            // Both ways, whoever's: the reply entry is the peer's (a Service's endpoint, whose
            // replies would take the stack, where conntrack never saw this SYN). Either holds
            // this pod's own address (its source is checked): it ends only its own flows.
            let _ = maps::FLOWS.remove(&flow.key());
            let _ = maps::FLOWS.remove(&flow.reply_key());
            false
        }
        Ok(flow) if flow.opens() => {
            has(&flow.key(), FLOW_VIA_STACK, owner) || has(&flow.reply_key(), FLOW_VIA_STACK, owner)
        }
        Ok(flow) => {
            let closing = if trusted { flow_closing_bits(flow.protocol, flow.tcp_flags) } else { 0 };
            has_closing(&flow.key(), FLOW_VIA_STACK, owner, closing)
        }
        Err(_) => icmp_error::flow_key(ctx).is_none_or(|key| has(&key, FLOW_VIA_STACK, owner)),
    }
}

/// [`via_stack`] for IPv6: an ICMPv6 error goes the way of the flow it quotes; another packet
/// without ports to tell its flow by (an extension header) takes the stack whenever a pod
/// involved is flagged.
#[inline(always)]
pub fn via_stack6(ctx: &TcContext, flagged: bool, owner: u64, trusted: bool) -> bool {
    if !flagged {
        return false;
    }
    match Flow6::parse(ctx) {
        Ok(flow) if trusted && flow.opens() => {
            let _ = maps::FLOWS.remove(&flow.key);
            let _ = maps::FLOWS.remove(&flow.reply_key());
            false
        }
        Ok(flow) if flow.opens() => {
            has(&flow.key, FLOW_VIA_STACK, owner) || has(&flow.reply_key(), FLOW_VIA_STACK, owner)
        }
        Ok(flow) => {
            let closing = if trusted { flow_closing_bits(flow.key.protocol, flow.tcp_flags) } else { 0 };
            has_closing(&flow.key, FLOW_VIA_STACK, owner, closing)
        }
        Err(_) => icmp_error6::quoted_reply_key(ctx).is_none_or(|key| has(&key, FLOW_VIA_STACK, owner)),
    }
}
