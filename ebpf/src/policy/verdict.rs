//! The checks. A packet of an isolated pod (either direction) is first looked up in
//! `POLICY_FLOWS`; a live entry whose side bit this check needs lets it through (one lookup).
//! Anything else is judged as a new flow: a subject not isolated this way allows it (and the
//! flow is remembered, so that its replies pass the way it is isolated); an isolated one
//! allows it if a rule does. Only allowed flows are remembered.
//!
//! A TCP SYN is always judged, entry or not: a new connection gets today's policy, and a SYN
//! never rides on an entry made for the other direction. A TCP segment without SYN and without
//! an entry (an LRU eviction, an entry aged out, a policy the pod got mid-connection) is judged
//! as new in its own direction, and failing that, as a reply: allowed if the subject's rules
//! for the other direction allow the flow it would answer (ports swapped). That keeps an
//! allowed connection alive after its entry is forgotten; a reply is only ever inferred from
//! rules the subject has (a direction not isolated infers nothing), so an unallowed peer's
//! forged ACK creates nothing. UDP is judged in its own direction only: any datagram may open.
use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_common::{
    MONITOR_POLICY_ALLOWED, MONITOR_POLICY_DENIED, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS,
    POLICY_FLOW_OPENER_OK, POLICY_FLOW_ORIGINAL, POLICY_FLOW_RESPONDER_OK,
};

use super::{Subject, flows, identity, rules, tuple};
use crate::{maps, monitor};

/// Whether the packet in `ctx` may go out of (`POLICY_DIRECTION_EGRESS`) or into the pod
/// `subject`. A denied one is counted on the policy's slot and reported; the caller drops it
/// (`DropReason::PolicyDenied`). Not inlined: the programs' fast paths stay as they were for
/// pods no policy isolates, and the check has its own frame.
#[inline(never)]
pub fn allows(ctx: &TcContext, subject: &Subject, direction: u8) -> bool {
    // Not IP: the callers' other checks see to it.
    let Some(mut tuple) = tuple::parse(ctx) else { return true };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if !tuple.opens()
        && let Some(entry) = flows::live(&tuple.key, now)
    {
        // SAFETY: an LRU value, valid while this program runs.
        let flags = unsafe { (*entry).flags };
        // The opener's side for a packet out of the opener or into it; the responder's else.
        let original = flags & POLICY_FLOW_ORIGINAL != 0;
        let needed = if (direction == POLICY_DIRECTION_EGRESS) == original {
            POLICY_FLOW_OPENER_OK
        } else {
            POLICY_FLOW_RESPONDER_OK
        };
        if flags & needed != 0 {
            // SAFETY: as above.
            unsafe { flows::touch(entry, now, tuple.closes()) };
            return true;
        }
    }
    judge(ctx, &mut tuple, subject, direction, now)
}

/// A new flow's verdict (see the module's comment); remembers an allowed one.
#[inline(always)]
fn judge(ctx: &TcContext, tuple: &mut tuple::Tuple, subject: &Subject, direction: u8, now: u64) -> bool {
    let egress = direction == POLICY_DIRECTION_EGRESS;
    let other = if egress { POLICY_DIRECTION_INGRESS } else { POLICY_DIRECTION_EGRESS };
    let key = &tuple.key;
    let ep = subject.endpoint;
    // As the opener's packet: the subject opens (egress) or is opened to (ingress).
    let (mut verdict, mut original) = if subject.isolated(direction) {
        let peer = identity::of(key, !egress);
        (rules::allowing(ep.identity, peer, direction, key.protocol, key.dst_port), true)
    } else {
        (Some(0), true)
    };
    if verdict.is_none() && tuple.mid_stream() && subject.isolated(other) {
        let peer = identity::of(key, !egress);
        verdict = rules::allowing(ep.identity, peer, other, key.protocol, key.src_port);
        original = false;
    }
    let Some(slot) = verdict else {
        let slot = subject.denied_slot(direction);
        count(slot, false);
        monitor::verdict(ctx, MONITOR_POLICY_DENIED, direction, slot, ep.ifindex, key);
        return false;
    };
    // The subject's own side: the opener's when it sends the opener's packet or receives a reply.
    let side = if egress == original { POLICY_FLOW_OPENER_OK } else { POLICY_FLOW_RESPONDER_OK };
    if subject.isolated(direction) || !original {
        count(slot, true);
        monitor::verdict(ctx, MONITOR_POLICY_ALLOWED, direction, slot, ep.ifindex, key);
    }
    flows::remember(tuple, original, side, ep.owner, slot, now);
    true
}

#[inline(always)]
fn count(slot: u32, allowed: bool) {
    if let Some(counts) = maps::POLICY_COUNTS.get_ptr_mut(slot) {
        // SAFETY: a per-CPU slot, only touched by this CPU while the program runs.
        unsafe {
            if allowed {
                (*counts).allowed_flows += 1;
            } else {
                (*counts).denied_flows += 1;
            }
        }
    }
}
