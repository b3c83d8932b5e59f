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
    IDENTITY_HOST, MONITOR_POLICY_ALLOWED, MONITOR_POLICY_DENIED, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS,
    POLICY_FLOW_OPENER_OK, POLICY_FLOW_ORIGINAL, POLICY_FLOW_RESPONDER_OK,
};

use super::{Subject, flows, identity, rules, scratch, scratch::Scratch, tuple};
use crate::{maps, monitor};

/// Whether the packet in `ctx` may go out of (`POLICY_DIRECTION_EGRESS`) or into the pod
/// `subject`. A denied one is counted on the policy's slot and reported; the caller drops it
/// (`DropReason::PolicyDenied`). Not inlined: the programs' fast paths stay as they were for
/// pods no policy isolates.
#[inline(never)]
pub fn allows(ctx: &TcContext, subject: &Subject, direction: u8) -> bool {
    // Always there (an array's slot 0); without it nothing could be judged: denied.
    let Some(s) = scratch::get() else { return false };
    // SAFETY: this CPU's scratch value, used by this program run alone.
    let s = unsafe { &mut *s };
    // Not IP, or neighbour discovery: the callers' other checks see to it.
    if !tuple::parse(ctx, s) {
        return true;
    }
    s.subject = *subject.endpoint;
    s.direction = direction;
    if cached(s) {
        return true;
    }
    judge(ctx, s)
}

/// Whether a live entry of the packet's key has the bit this check needs; one that has lives on.
#[inline(always)]
fn cached(s: &mut Scratch) -> bool {
    if tuple::opens(s) {
        return false;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(entry) = flows::live(&s.key, now) else { return false };
    // SAFETY: an LRU value, valid while this program runs.
    let flags = unsafe { (*entry).flags };
    // The opener's side for a packet out of the opener or into it; the responder's else.
    let original = flags & POLICY_FLOW_ORIGINAL != 0;
    let needed = if (s.direction == POLICY_DIRECTION_EGRESS) == original {
        POLICY_FLOW_OPENER_OK
    } else {
        POLICY_FLOW_RESPONDER_OK
    };
    if flags & needed == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { flows::touch(entry, now, tuple::closes(s)) };
    true
}

/// A new flow's verdict (see the module's comment); remembers an allowed one. This node's own
/// addresses (`IDENTITY_HOST`: kubelet's probes) are always allowed in.
#[inline(always)]
fn judge(ctx: &TcContext, s: &mut Scratch) -> bool {
    let direction = s.direction;
    let egress = direction == POLICY_DIRECTION_EGRESS;
    let isolated = s.isolated(direction);
    let mut original = true;
    // As the opener's packet: the subject opens (egress) or is opened to (ingress).
    let mut verdict = Some(0);
    if isolated {
        let peer = identity::of(s, !egress);
        verdict = if !egress && peer == IDENTITY_HOST {
            Some(0)
        } else {
            rules::allowing(s, peer, direction, s.key.dst_port)
        };
    }
    let other = if egress { POLICY_DIRECTION_INGRESS } else { POLICY_DIRECTION_EGRESS };
    if verdict.is_none() && tuple::mid_stream(s) && s.isolated(other) {
        let peer = identity::of(s, !egress);
        verdict = rules::allowing(s, peer, other, s.key.src_port);
        original = false;
    }
    let Some(slot) = verdict else {
        let slot = s.denied_slot();
        count(slot, false);
        monitor::verdict(ctx, MONITOR_POLICY_DENIED, s.direction, slot, s.subject.ifindex, &s.key);
        return false;
    };
    if isolated {
        count(slot, true);
        monitor::verdict(ctx, MONITOR_POLICY_ALLOWED, s.direction, slot, s.subject.ifindex, &s.key);
    }
    // The subject's own side: the opener's when it sends the opener's packet or receives a reply.
    let side = if egress == original { POLICY_FLOW_OPENER_OK } else { POLICY_FLOW_RESPONDER_OK };
    flows::remember(s, original, side, slot);
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
