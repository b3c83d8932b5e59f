//! Events for `ebpf-cni monitor` (`MONITOR_EVENTS`, see `ebpf_common::MonitorEvent`): written only
//! while a monitor listens, at a bounded rate per CPU.
//!
//! The callers pay one array read and a compare while nobody listens: `MONITOR_CONTROL`'s
//! `listening_until_ns` is 0 then (the monitor writes 0 when it exits; one killed leaves a time
//! in the past, which the out-of-line part finds with one clock read). Everything else — the
//! clock, the per-CPU budget, the ring buffer, the packet's headers — is in BPF functions of
//! their own (`#[inline(never)]`): the sixty-odd drop sites of the programs inline only the check,
//! and the callee's small frame is all it adds to the caller's stack.
use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{
    DropReason, FAMILY_IPV4, FAMILY_IPV6, FlowKey, MONITOR_DROP, MONITOR_NO_DIRECTION, MONITOR_POLICY_DENIED,
    MonitorEvent,
};

use crate::maps;

const ETHERTYPE_OFFSET: u32 = 12;
const IP_OFFSET: u32 = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_SCTP: u8 = 132;
const SECOND_NS: u64 = 1_000_000_000;

/// A packet dropped for `reason` (called from `maps::drop`). A policy's denial is not sent here:
/// the policy code reports it with [`verdict`], with the policy and direction this lacks.
#[inline(always)]
pub fn drop(ctx: &TcContext, reason: DropReason) {
    if !matches!(reason, DropReason::PolicyDenied) && listening() {
        drop_event(ctx, reason as u32);
    }
}

/// A new flow's policy verdict: `kind` is `MONITOR_POLICY_ALLOWED` or `MONITOR_POLICY_DENIED`,
/// `direction` `MONITOR_INGRESS`/`MONITOR_EGRESS` as seen by the pod at `ctx`'s interface or the
/// pod the packet is delivered into (`ifindex`), `key` the packet's own 5-tuple.
#[inline(always)]
#[allow(dead_code, reason = "called by the policy datapath once it lands")]
pub fn verdict(ctx: &TcContext, kind: u8, direction: u8, slot: u32, ifindex: u32, key: &FlowKey) {
    if listening() {
        // Five arguments at most to a BPF function: kind and direction share one.
        verdict_event(ctx.len(), u32::from(kind) | u32::from(direction) << 8, slot, ifindex, key);
    }
}

/// Whether a monitor may listen: the one check every caller inlines.
#[inline(always)]
fn listening() -> bool {
    // The monitor replaces the value whole; a torn read would cost one event more or less.
    maps::MONITOR_CONTROL.get(0).is_some_and(|control| control.listening_until_ns != 0)
}

#[inline(never)]
fn drop_event(ctx: &TcContext, reason: u32) {
    let Some(event) = reserve() else { return };
    // SAFETY: `event` is a reserved record of the ring buffer, ours until submitted.
    unsafe {
        (*event).kind = MONITOR_DROP;
        (*event).direction = MONITOR_NO_DIRECTION;
        (*event).reason = reason;
        (*event).len = ctx.len();
        (*event).ifindex = (*ctx.skb.skb).ifindex;
        read_headers(ctx, event);
    }
    submit(event);
}

#[inline(never)]
fn verdict_event(len: u32, kind_and_direction: u32, slot: u32, ifindex: u32, key: &FlowKey) {
    let Some(event) = reserve() else { return };
    let kind = kind_and_direction as u8;
    // SAFETY: as in `drop_event`.
    unsafe {
        (*event).kind = kind;
        (*event).direction = (kind_and_direction >> 8) as u8;
        (*event).reason = if kind == MONITOR_POLICY_DENIED { DropReason::PolicyDenied as u32 } else { 0 };
        (*event).policy_slot = slot;
        (*event).ifindex = ifindex;
        (*event).len = len;
        (*event).family = key.family;
        (*event).protocol = key.protocol;
        (*event).src_port = key.src_port;
        (*event).dst_port = key.dst_port;
        (*event).src_addr = key.src_addr;
        (*event).dst_addr = key.dst_addr;
    }
    submit(event);
}

/// A zeroed record with its time, if a monitor listens, this CPU's budget has room and the ring
/// buffer too; otherwise none, the miss counted in `lost` (while a monitor listens).
#[inline(always)]
fn reserve() -> Option<*mut MonitorEvent> {
    let control = maps::MONITOR_CONTROL.get(0)?;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now >= control.listening_until_ns {
        return None;
    }
    let budget = maps::MONITOR_BUDGET.get_ptr_mut(0)?;
    // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
    unsafe {
        if now.wrapping_sub((*budget).window_start_ns) >= SECOND_NS {
            (*budget).window_start_ns = now;
            (*budget).sent = 0;
        }
        if (*budget).sent >= control.rate_per_sec {
            (*budget).lost += 1;
            return None;
        }
        let Some(mut entry) = maps::MONITOR_EVENTS.reserve(0) else {
            (*budget).lost += 1;
            return None;
        };
        (*budget).sent += 1;
        let event = entry.as_mut_ptr();
        *event = MonitorEvent { time_ns: now, ..MonitorEvent::default() };
        // Submitted by the caller through the raw pointer (`submit`).
        core::mem::forget(entry);
        Some(event)
    }
}

#[inline(always)]
fn submit(event: *mut MonitorEvent) {
    // SAFETY: `event` came from `bpf_ringbuf_reserve` in `reserve` and is submitted once.
    unsafe { aya_ebpf::helpers::bpf_ringbuf_submit(event.cast(), 0) };
}

/// Family, protocol, addresses and ports of the packet, read with `bpf_skb_load_bytes` (any
/// part of the packet, no bounds for the verifier to follow). A frame that is not IP, or too
/// short, leaves the fields it lacks zero. IPv6 extension headers are not walked: the ports
/// of a packet that has them stay zero.
#[inline(always)]
unsafe fn read_headers(ctx: &TcContext, event: *mut MonitorEvent) {
    let Ok(ethertype) = ctx.load::<[u8; 2]>(ETHERTYPE_OFFSET as usize) else { return };
    let (protocol, l4) = match u16::from_be_bytes(ethertype) {
        ETHERTYPE_IPV4 => {
            // Version and header length, then protocol (9), addresses (12, 16).
            let Ok(ip) = ctx.load::<[u8; 10]>(IP_OFFSET as usize) else { return };
            // SAFETY: the record is ours; the lengths are the fields'.
            unsafe {
                (*event).family = FAMILY_IPV4;
                (*event).protocol = ip[9];
                load(ctx, IP_OFFSET + 12, (*event).src_addr.as_mut_ptr(), 4);
                load(ctx, IP_OFFSET + 16, (*event).dst_addr.as_mut_ptr(), 4);
            }
            // A later fragment carries no ports.
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
                return;
            }
            (ip[9], IP_OFFSET + u32::from(ip[0] & 0x0f) * 4)
        }
        ETHERTYPE_IPV6 => {
            let Ok(next_header) = ctx.load::<u8>(IP_OFFSET as usize + 6) else { return };
            // SAFETY: as above.
            unsafe {
                (*event).family = FAMILY_IPV6;
                (*event).protocol = next_header;
                load(ctx, IP_OFFSET + 8, (*event).src_addr.as_mut_ptr(), 16);
                load(ctx, IP_OFFSET + 24, (*event).dst_addr.as_mut_ptr(), 16);
            }
            (next_header, IP_OFFSET + 40)
        }
        _ => return,
    };
    if protocol == PROTO_TCP || protocol == PROTO_UDP || protocol == PROTO_SCTP {
        // All three begin with the source and destination ports.
        if let Ok(ports) = ctx.load::<[u8; 4]>(l4 as usize) {
            // SAFETY: as above.
            unsafe {
                (*event).src_port = u16::from_be_bytes([ports[0], ports[1]]);
                (*event).dst_port = u16::from_be_bytes([ports[2], ports[3]]);
            }
        }
    }
}

/// `len` bytes at `offset` of the packet into `to`; left as they were (zero) if it is shorter.
#[inline(always)]
unsafe fn load(ctx: &TcContext, offset: u32, to: *mut u8, len: u32) {
    // SAFETY: `to` points at `len` bytes of the caller's record.
    unsafe { aya_ebpf::helpers::bpf_skb_load_bytes(ctx.skb.skb.cast(), offset, to.cast(), len) };
}
