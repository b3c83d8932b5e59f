//! Events for `ebpf-cni monitor` (`MONITOR_EVENTS`, see `ebpf_common::MonitorEvent`): written only
//! while a monitor listens, at a bounded rate per CPU.
//!
//! The callers pay one array read and a compare while nobody listens: `MONITOR_CONTROL`'s
//! `listening_until_ns` is 0 then (the monitor writes 0 when it exits; one killed leaves a time
//! in the past, which the out-of-line part finds with one clock read and clears 10 s later).
//! Everything else — the
//! clock, the per-CPU budget, the ring buffer, the packet's headers — is in BPF functions of
//! their own (`#[inline(never)]`): the sixty-odd drop sites of the programs inline only the check.
//! The two entry points are BPF global functions, which the verifier checks once per program
//! rather than once per call site.
//! Those functions keep no stack (the event is built in a per-CPU map value, `MONITOR_SCRATCH`,
//! map keys are read from a global): they are called from frames that use nearly all of the 512
//! bytes a call chain may have (`from_pod`'s with the policy check, `from_uplink6`'s).
use aya_ebpf::{
    bindings::__sk_buff,
    cty::c_void,
    helpers::{bpf_ktime_get_ns, bpf_map_lookup_elem},
    programs::TcContext,
};
use ebpf_common::{
    DropReason, FAMILY_IPV4, FAMILY_IPV6, FlowKey, MONITOR_DROP, MONITOR_NO_DIRECTION, MONITOR_POLICY_DENIED,
    MonitorBudget, MonitorControl, MonitorEvent,
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
/// How long after a monitor's last renewal lapsed the programs clear its slot.
const LAPSED_NS: u64 = 10 * SECOND_NS;

/// A packet dropped for `reason` (called from `maps::drop`). A policy's denial is not sent here:
/// the policy code reports it with [`verdict`], with the policy and direction this lacks.
#[inline(always)]
pub fn drop(ctx: &TcContext, reason: DropReason) {
    if matches!(reason, DropReason::PolicyDenied) {
        return;
    }
    if listening().is_some() {
        monitor_drop_event(ctx.skb.skb, reason as u32);
    }
}

/// A new flow's policy verdict: `kind` is `MONITOR_POLICY_ALLOWED` or `MONITOR_POLICY_DENIED`,
/// `direction` `MONITOR_INGRESS`/`MONITOR_EGRESS` as seen by the pod at `ctx`'s interface or the
/// pod the packet is delivered into (`ifindex`), `key` the packet's own 5-tuple.
#[inline(always)]
#[allow(dead_code, reason = "called by the policy datapath once it lands")]
pub fn verdict(ctx: &TcContext, kind: u8, direction: u8, slot: u32, ifindex: u32, key: &FlowKey) {
    if listening().is_some() {
        // Kind, direction and length in one argument, the policy slot and the interface in
        // another: fewer values for the callee to keep across its helper calls.
        let kind_direction_len = u64::from(kind) | u64::from(direction) << 8 | u64::from(ctx.len()) << 32;
        monitor_verdict_event(kind_direction_len, u64::from(slot) << 32 | u64::from(ifindex), key);
    }
}

/// The control slot if a monitor may listen: the one check every caller inlines.
#[inline(always)]
fn listening() -> Option<*mut MonitorControl> {
    let control = lookup(&maps::MONITOR_CONTROL).cast::<MonitorControl>();
    // The monitor replaces the value whole; a torn read would cost one event more or less.
    // SAFETY: an array slot, valid for the program run.
    (!control.is_null() && unsafe { (*control).listening_until_ns } != 0).then_some(control)
}

/// The skb itself rather than the caller's `TcContext` (a pointer to the caller's stack). No
/// more values are kept across a helper call than the four registers that survive one (a spill
/// would be stack): the control slot is looked up again rather than passed (the compiler would
/// pass its two fields, one argument too many).
///
/// A BPF global function (exported, BTF linkage global): the verifier checks it once per
/// program, on its own, instead of once at each of the sixty-odd drop sites with the caller's
/// state. Hence the C ABI, the context as the kernel's `__sk_buff` and a scalar to return
/// (always 0).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn monitor_drop_event(skb: *mut __sk_buff, reason: u32) -> u32 {
    drop_event(skb, reason);
    0
}

#[inline(always)]
fn drop_event(skb: *mut __sk_buff, reason: u32) {
    let Some(control) = listening() else { return };
    let Some(event) = scratch() else { return };
    // SAFETY: this CPU's scratch record and the kernel's skb, both valid for the program run.
    unsafe {
        clear(event);
        (*event).kind = MONITOR_DROP;
        (*event).direction = MONITOR_NO_DIRECTION;
        (*event).reason = reason;
        (*event).len = (*skb).len;
        (*event).ifindex = (*skb).ifindex;
    }
    let Some((now, budget)) = admit(control) else { return };
    // SAFETY: as above.
    unsafe { (*event).time_ns = now };
    read_headers(skb, event);
    send(event, budget);
}

/// Called for every new flow a policy judges, denied floods included. As in `drop_event`, the
/// control slot is looked up again, here once the record is filled from the arguments: the
/// three of them and the slot's two fields would not fit the registers a helper call keeps.
/// A BPF global function, verified once per program like [`monitor_drop_event`]; `key` may be
/// null for the verifier, and returns 0.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn monitor_verdict_event(kind_direction_len: u64, slot_ifindex: u64, key: *const FlowKey) -> u32 {
    // SAFETY: the caller's 5-tuple (in the policy's scratch value), or null.
    if let Some(key) = unsafe { key.as_ref() } {
        verdict_event(kind_direction_len, slot_ifindex, key);
    }
    0
}

#[inline(always)]
fn verdict_event(kind_direction_len: u64, slot_ifindex: u64, key: &FlowKey) {
    let Some(event) = scratch() else { return };
    let kind = kind_direction_len as u8;
    // SAFETY: this CPU's scratch record.
    unsafe {
        clear(event);
        (*event).kind = kind;
        (*event).direction = (kind_direction_len >> 8) as u8;
        (*event).reason = if kind == MONITOR_POLICY_DENIED { DropReason::PolicyDenied as u32 } else { 0 };
        (*event).policy_slot = (slot_ifindex >> 32) as u32;
        (*event).ifindex = slot_ifindex as u32;
        (*event).len = (kind_direction_len >> 32) as u32;
        (*event).family = key.family;
        (*event).protocol = key.protocol;
        (*event).src_port = key.src_port;
        (*event).dst_port = key.dst_port;
    }
    // Two words each: an array assignment compiles to a call of a byte-by-byte `memmove`, which
    // the verifier walks (sixteen rounds of its loop) in every program that has the function.
    // SAFETY: the record's addresses and the key's start on 8-byte boundaries (both structs are
    // aligned to 8, the fields at offsets 32/48 and 8/24).
    unsafe {
        copy_words(&raw mut (*event).src_addr, &key.src_addr);
        copy_words(&raw mut (*event).dst_addr, &key.dst_addr);
    }
    let Some(control) = listening() else { return };
    let Some((now, budget)) = admit(control) else { return };
    // SAFETY: as above.
    unsafe { (*event).time_ns = now };
    send(event, budget);
}

/// Copies a 16-byte address as two 8-byte words.
///
/// # Safety
/// Both are 8-aligned.
#[inline(always)]
unsafe fn copy_words(to: *mut [u8; 16], from: *const [u8; 16]) {
    let (to, from) = (to.cast::<u64>(), from.cast::<u64>());
    // SAFETY: by the caller.
    unsafe {
        core::ptr::write_volatile(to, core::ptr::read_volatile(from));
        core::ptr::write_volatile(to.add(1), core::ptr::read_volatile(from.add(1)));
    }
}

/// The time, and this CPU's budget with the event counted in it, if a monitor listens and the
/// budget has room; a miss for the rate is counted in `lost` (while a monitor listens).
#[inline(always)]
fn admit(control: *mut MonitorControl) -> Option<(u64, *mut MonitorBudget)> {
    // SAFETY: bpf_ktime_get_ns has no preconditions; `control` is the control slot.
    let (now, until, rate) = unsafe { (bpf_ktime_get_ns(), (*control).listening_until_ns, (*control).rate_per_sec) };
    if now >= until {
        // A monitor killed without a word. Once that is long past, the slot is cleared, so that
        // drops cost the one check again. A monitor starting at that very moment may lose its
        // first renewal to this write: its events then begin with its next, a second later.
        if now - until > LAPSED_NS {
            // SAFETY: as above.
            unsafe { core::ptr::write_volatile(&raw mut (*control).listening_until_ns, 0) };
        }
        return None;
    }
    let budget = lookup(&maps::MONITOR_BUDGET).cast::<MonitorBudget>();
    if budget.is_null() {
        return None;
    }
    // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
    unsafe {
        if now.wrapping_sub((*budget).window_start_ns) >= SECOND_NS {
            (*budget).window_start_ns = now;
            (*budget).sent = 0;
        }
        if (*budget).sent >= rate {
            (*budget).lost += 1;
            return None;
        }
        (*budget).sent += 1;
    }
    Some((now, budget))
}

/// Copies the record into the ring buffer; a full buffer turns the event from sent into lost.
#[inline(always)]
fn send(event: *mut MonitorEvent, budget: *mut MonitorBudget) {
    // SAFETY: `event` is this CPU's scratch record, `budget` its budget slot.
    unsafe {
        if maps::MONITOR_EVENTS.output(&*event, 0).is_err() {
            (*budget).sent -= 1;
            (*budget).lost += 1;
        }
    }
}

/// This CPU's record to fill (`MONITOR_SCRATCH`): the stack has no room for it.
#[inline(always)]
fn scratch() -> Option<*mut MonitorEvent> {
    let event = lookup(&maps::MONITOR_SCRATCH).cast::<MonitorEvent>();
    (!event.is_null()).then_some(event)
}

/// Word by word: a whole-struct write compiles to a call of `memset`, a BPF function with a
/// frame of its own.
#[inline(always)]
unsafe fn clear(event: *mut MonitorEvent) {
    let words = event.cast::<u64>();
    for i in 0..size_of::<MonitorEvent>() / 8 {
        // SAFETY: within the record, whose size is a multiple of 8.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
}

/// Slot 0 of a one-slot array map, looked up with a key in read-only global memory: aya's
/// `get` puts the key on the stack, and this code must not use any.
#[inline(always)]
fn lookup<M>(map: &M) -> *mut c_void {
    // SAFETY: a map of this object and a key of the array's key size.
    unsafe { bpf_map_lookup_elem(core::ptr::from_ref(map).cast_mut().cast(), (&raw const ZERO).cast()) }
}

/// The key of the one-slot arrays.
static ZERO: u32 = 0;

/// Family, protocol, addresses and ports of the packet, read with `bpf_skb_load_bytes` (any
/// part of the packet, no bounds for the verifier to follow) straight into the record: this
/// function is called from frames near the 512 bytes of stack the verifier allows a call chain
/// (`from_uplink6`'s), so it keeps none of its own. A frame that is not IP, or too short, leaves
/// the fields it lacks zero. IPv6 extension headers are not walked: the ports of a packet that
/// has them stay zero. A function of its own, with two values to keep across its helper calls:
/// no spills, no stack.
#[inline(never)]
fn read_headers(skb: *mut __sk_buff, event: *mut MonitorEvent) {
    // SAFETY: the record is ours; every load's length fits the field it lands in.
    unsafe {
        // The destination address's bytes hold the headers read before it is.
        let scratch = (*event).dst_addr.as_mut_ptr();
        if load(skb, ETHERTYPE_OFFSET, scratch, 2) != 0 {
            return;
        }
        // Where the ports are (0: none), kept in the ports' own bytes until they are read: a
        // value kept in a register across the address loads would be spilled to the stack.
        let ports = (&raw mut (*event).src_port).cast::<u32>();
        match u16::from_be_bytes([*scratch, *scratch.add(1)]) {
            ETHERTYPE_IPV4 => {
                // Version and header length (0), fragment field (6), protocol (9).
                if load(skb, IP_OFFSET, scratch, 10) != 0 {
                    return; // zeroed by the failed load
                }
                let protocol = *scratch.add(9);
                let later_fragment = u16::from_be_bytes([*scratch.add(6), *scratch.add(7)]) & 0x1fff != 0;
                let l4 =
                    if later_fragment || !has_ports(protocol) { 0 } else { IP_OFFSET + u32::from(*scratch & 0x0f) * 4 };
                core::ptr::write_volatile(ports, l4);
                (*event).family = FAMILY_IPV4;
                (*event).protocol = protocol;
                // Two words: a 16-byte write would compile to a call of `memset`.
                core::ptr::write_volatile(scratch.cast::<u64>(), 0);
                core::ptr::write_volatile(scratch.add(8).cast::<u64>(), 0);
                load(skb, IP_OFFSET + 12, (*event).src_addr.as_mut_ptr(), 4);
                load(skb, IP_OFFSET + 16, scratch, 4);
            }
            ETHERTYPE_IPV6 => {
                if load(skb, IP_OFFSET + 6, scratch, 1) != 0 {
                    return;
                }
                let protocol = *scratch;
                core::ptr::write_volatile(ports, if has_ports(protocol) { IP_OFFSET + 40 } else { 0 });
                (*event).family = FAMILY_IPV6;
                (*event).protocol = protocol;
                load(skb, IP_OFFSET + 8, (*event).src_addr.as_mut_ptr(), 16);
                load(skb, IP_OFFSET + 24, scratch, 16);
            }
            _ => {
                *scratch = 0;
                *scratch.add(1) = 0;
                return;
            }
        }
        let l4 = core::ptr::read_volatile(ports);
        if l4 == 0 {
            return;
        }
        core::ptr::write_volatile(ports, 0);
        if load(skb, l4, ports.cast(), 4) == 0 {
            (*event).src_port = u16::from_be((*event).src_port);
            (*event).dst_port = u16::from_be((*event).dst_port);
        }
    }
}

/// TCP, UDP and SCTP: they begin with the source and destination ports, as the record has them.
#[inline(always)]
fn has_ports(protocol: u8) -> bool {
    protocol == PROTO_TCP || protocol == PROTO_UDP || protocol == PROTO_SCTP
}

/// `len` bytes at `offset` of the packet into `to`: 0, or an error with `to` zeroed.
#[inline(always)]
unsafe fn load(skb: *mut __sk_buff, offset: u32, to: *mut u8, len: u32) -> i64 {
    // SAFETY: `to` points at `len` bytes of the caller's record.
    unsafe { aya_ebpf::helpers::bpf_skb_load_bytes(skb.cast(), offset, to.cast(), len) }
}
