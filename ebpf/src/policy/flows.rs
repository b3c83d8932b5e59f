//! `POLICY_FLOWS`: the verdicts of allowed flows, one entry per direction, so that each later
//! packet of a flow, and each of its replies (UDP's too), costs one lookup. Written only for a
//! flow some check allowed, never for a denied packet: a flood of those cannot evict anything.
//! A flow between two subjects of this node gets one entry for both pods instead (`pair.rs`).
//!
//! An entry says which side allowed the flow (`POLICY_FLOW_OPENER_OK`: the opener's egress;
//! `POLICY_FLOW_RESPONDER_OK`: the responder's ingress), so that the two checks of a flow
//! between two pods of this node each need their own side's bit: the sender's egress verdict
//! is no verdict on the receiver's ingress.
//!
//! Each pod's entries are its own (the key's `pad[0]` says which end of the packet the pod is,
//! `owner` which attachment): an entry of another owner, a deleted pod's whose address a new
//! pod got, is no entry; it is replaced when the new pod's own check allows the flow.
//!
//! Entries age like conntrack's: idle TCP 24 h (5 days in conntrack; kube-proxy sets 24 h),
//! TCP after a FIN or RST 122 s, UDP 180 s, ICMP and the rest 60 s. An entry older than that is
//! no entry: the 5-tuple's next packet is judged again. The LRU forgets the least recently used
//! when full; the next packet of such a flow is judged again too (`verdict.rs`).
//!
//! Times are `clock.rs`'s (CLOCK_MONOTONIC at the tick's resolution): a fraction of the precise
//! clock's cost per packet, and ages of seconds need no better.
use aya_ebpf::bindings::BPF_ANY;
use ebpf_common::{
    FLOW_TIMEOUT_ICMP_NS, FLOW_TIMEOUT_TCP_FIN_NS, FLOW_TIMEOUT_TCP_NS, FLOW_TIMEOUT_UDP_NS, FlowKey,
    POLICY_FLOW_CLOSING, POLICY_FLOW_ORIGINAL, PolicyFlow,
};

use super::{budget, clock, scratch::Scratch, tuple};
use crate::{
    flow::{PROTO_TCP, PROTO_UDP},
    maps,
};

/// `last_seen_ns` is written at most this often: a write moves the entry's cache line.
const TOUCH_EVERY_NS: u64 = 1_000_000_000;

#[inline(always)]
fn timeout(protocol: u8, flags: u32) -> u64 {
    match protocol {
        PROTO_TCP if flags & POLICY_FLOW_CLOSING != 0 => FLOW_TIMEOUT_TCP_FIN_NS,
        PROTO_TCP => FLOW_TIMEOUT_TCP_NS,
        PROTO_UDP => FLOW_TIMEOUT_UDP_NS,
        _ => FLOW_TIMEOUT_ICMP_NS,
    }
}

/// The entry of `key`, unless missing, aged out or another attachment's than `owner`.
#[inline(always)]
pub fn live(key: &FlowKey, now: u64, owner: u64) -> Option<*mut PolicyFlow> {
    let entry = maps::POLICY_FLOWS.get_ptr_mut(key)?;
    // SAFETY: an LRU value, valid while this program runs.
    let (seen, flags, held_by) = unsafe { ((*entry).last_seen_ns, (*entry).flags, (*entry).owner) };
    (held_by == owner && now.saturating_sub(seen) <= timeout(key.protocol, flags)).then_some(entry)
}

/// A packet of the flow passed: the entry lives on; a FIN or RST starts its closing.
///
/// # Safety
/// `entry` is a `POLICY_FLOWS` value ([`live`]).
#[inline(always)]
pub unsafe fn touch(entry: *mut PolicyFlow, now: u64, closes: bool) {
    // SAFETY: by the caller; a lost race between CPUs only repeats a write.
    unsafe {
        if now.saturating_sub((*entry).last_seen_ns) >= TOUCH_EVERY_NS {
            (*entry).last_seen_ns = now;
        }
        if closes && (*entry).flags & POLICY_FLOW_CLOSING == 0 {
            (*entry).flags |= POLICY_FLOW_CLOSING;
        }
    }
}

/// Records that `side` (`POLICY_FLOW_OPENER_OK` or `POLICY_FLOW_RESPONDER_OK`) allowed the
/// flow of `s.key`, whose packet is the opener's (`original`) or a reply: [`prepare`], then
/// [`keep`].
#[inline(always)]
pub fn remember(s: &mut Scratch, original: bool, side: u32, slot: u32) {
    prepare(s, original, side, slot);
    keep(s);
}

/// The entry [`keep`] writes, in `s.flow`: kept in the scratch value across the helper calls,
/// not in registers that would spill onto the callers' stack.
#[inline(always)]
pub fn prepare(s: &mut Scratch, original: bool, side: u32, slot: u32) {
    s.flow = PolicyFlow {
        last_seen_ns: clock::now(s),
        owner: s.subject.owner,
        slot,
        flags: side | if original { POLICY_FLOW_ORIGINAL } else { 0 },
    };
}

/// Writes the entries of `s.flow` ([`prepare`]) for both directions of `s.key`, within the
/// subject's budget. An entry of the same flow in the same orientation keeps the other side's
/// bit; anything else is replaced. A TCP SYN starts the flow over: whatever an entry held
/// before is not kept, so it is not looked up either (a lookup less per new connection; a
/// closing flag would be cleared anyway), and it pays the budget.
#[inline(always)]
pub fn keep(s: &mut Scratch) {
    let existing = if tuple::opens(s) { None } else { live(&s.key, s.flow.last_seen_ns, s.subject.owner) };
    match existing {
        Some(entry) => {
            // SAFETY: an LRU value, valid while this program runs.
            let flags = unsafe { (*entry).flags };
            if flags & POLICY_FLOW_ORIGINAL == s.flow.flags & POLICY_FLOW_ORIGINAL {
                s.flow.flags |= flags;
            }
        }
        // A flow the pod already has (another side's verdict) costs no budget.
        None => {
            s.budget_owner = s.subject.owner;
            s.budget_direction = s.direction;
            s.budget_entries = 2;
            if !budget::admit(s) {
                return;
            }
        }
    }
    let _ = maps::POLICY_FLOWS.insert(&s.key, &s.flow, u64::from(BPF_ANY));
    s.flow.flags ^= POLICY_FLOW_ORIGINAL;
    tuple::turn(s);
    let _ = maps::POLICY_FLOWS.insert(&s.key, &s.flow, u64::from(BPF_ANY));
    tuple::turn(s);
}

/// [`keep`] for `from_pod`'s check whose entries waited for the receiver's (`pair.rs`), when
/// the packet goes to the node's stack after all. Not inlined: `from_pod`'s frame leaves it
/// 64 bytes.
#[inline(never)]
pub fn keep_deferred(s: &mut Scratch) {
    s.deferred = 0;
    keep(s);
}
