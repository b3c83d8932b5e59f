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
//!
//! An ICMP error passes where a reply of the flow it quotes would (`tuple::inner`): never
//! remembered, never opening anything. Others are judged as themselves (ICMP, no ports).
use aya_ebpf::{bindings::__sk_buff, programs::TcContext};
use ebpf_common::{
    IDENTITY_HOST, MONITOR_POLICY_ALLOWED, MONITOR_POLICY_DENIED, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS,
    POLICY_FLOW_OPENER_OK, POLICY_FLOW_ORIGINAL, POLICY_FLOW_RESPONDER_OK, POLICY_FLOW_VIA_STACK, PolicyEndpoint,
};

use super::{Subject, clock, flows, identity, pair, rules, scratch, scratch::Scratch, tuple};
use crate::{maps, monitor};

/// Whether the packet in `ctx` may go out of (`POLICY_DIRECTION_EGRESS`) or into the pod
/// `subject`. A denied one is counted on the policy's slot and reported; the caller drops it
/// (`DropReason::PolicyDenied`). Not inlined: the programs' fast paths stay as they were for
/// pods no policy isolates.
///
/// `pairing` (`pair.rs`): `pair::FROM_POD`, `from_pod`'s check of a packet to a subject of this
/// node that `deliver::into_pod` checks next: an allowed flow is left pending for that check,
/// its entries with it (the pair entry stands for both checks); `pair::INTO_POD`, that check:
/// it takes `from_pod`'s vouch for this packet and this receiver, if any, reuses the tuple
/// `from_pod`'s check read, and writes the pair entry of a pending flow it allows too; else 0.
#[inline(always)]
pub fn allows(ctx: &TcContext, subject: &Subject, direction: u8, pairing: u8) -> bool {
    policy_allows(ctx.skb.skb, subject.endpoint, direction, pairing)
}

/// [`allows`] as a BPF global function (exported: BTF linkage global). The verifier checks it
/// once per program, on its own, for any arguments of its types, instead of again at each call
/// site with that caller's state: with the checks' size and their call sites (both families in
/// `from_pod`, the pair check, `to_pod`, the uplink's) that was most of a first ADD. Hence the C
/// ABI, the kernel's `__sk_buff` for the context and a raw pointer for the subject's entry,
/// which the verifier only knows as memory of its size that may be null.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn policy_allows(
    skb: *mut __sk_buff,
    endpoint: *const PolicyEndpoint,
    direction: u8,
    pairing: u8,
) -> bool {
    // SAFETY: a `POLICY_ENDPOINTS` value, valid while this program runs, or null.
    let Some(endpoint) = (unsafe { endpoint.as_ref() }) else { return false };
    check(&TcContext::new(skb), &Subject { endpoint }, direction, pairing)
}

#[inline(always)]
fn check(ctx: &TcContext, subject: &Subject, direction: u8, pairing: u8) -> bool {
    // Always there (an array's slot 0); without it nothing could be judged: denied.
    let Some(s) = scratch::get() else { return false };
    // SAFETY: this CPU's scratch value, used by this program run alone.
    let s = unsafe { &mut *s };
    s.pair_pending = 0;
    if pairing == pair::INTO_POD && s.vouch != 0 && pair::vouched_for(ctx, s, subject) {
        if s.vouch == pair::VOUCHED {
            s.vouch = 0;
            return true;
        }
        s.pair_pending = 1;
    }
    // The tuple is this packet's: `pair::cached` read it for this check, or `from_pod`'s check
    // did for this delivery.
    let parsed = s.pair_pending != 0 || (pairing == pair::FROM_POD && s.parsed != 0);
    s.vouch = 0;
    s.parsed = 0;
    s.deferred = 0;
    s.pairing = pairing;
    if !start(ctx, s, subject, direction, parsed) {
        return true;
    }
    if !finish(ctx, s) {
        return false;
    }
    if s.icmp_error == 0 {
        if s.pairing == pair::FROM_POD {
            s.vouch = pair::PENDING;
        } else if s.pair_pending != 0 {
            pair::remember(s);
        }
    }
    true
}

/// `from_pod`'s check of a packet from `sender` to `receiver`, another pod of this node whose
/// ingress `deliver::into_pod` checks next, in the same program run: with the flow's pair
/// entry, one lookup for both (`pair.rs`), in a frame of its own ([`policy_allows_pair`], 16
/// bytes); without one (a SYN, a flow not yet known), the sender's check ([`policy_allows`]),
/// called from `from_pod` too, not from the pair's frame: the two frames in one chain would
/// take more stack than `from_pod`'s leaves, and the pair's lookup is cheaper inside its
/// frame than behind one more call (every return costs on a kernel with the Safe RET
/// mitigation: ~8 ns a packet here).
#[inline(always)]
pub fn allows_pair(ctx: &TcContext, sender: &Subject, receiver: &Subject) -> bool {
    policy_allows_pair(ctx.skb.skb, sender.endpoint, receiver.endpoint)
        || allows(ctx, sender, POLICY_DIRECTION_EGRESS, pair::FROM_POD)
}

/// [`allows_pair`]'s lookup as a BPF global function, verified once per program (see
/// [`policy_allows`]): whether the pair entry allows the packet.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn policy_allows_pair(
    skb: *mut __sk_buff,
    sender: *const PolicyEndpoint,
    receiver: *const PolicyEndpoint,
) -> bool {
    // SAFETY: `POLICY_ENDPOINTS` values, valid while this program runs, or null.
    let (Some(sender), Some(receiver)) = (unsafe { sender.as_ref() }, unsafe { receiver.as_ref() }) else {
        return false;
    };
    let (ctx, sender, receiver) = (TcContext::new(skb), Subject { endpoint: sender }, Subject { endpoint: receiver });
    pair::cached(&ctx, &sender, &receiver)
}

/// Reads the packet's key for a check of `subject` in `direction`, unless `parsed` (the scratch
/// value has it); false for a packet no policy judges (not IP, neighbour discovery: the
/// callers' other checks see to it).
#[inline(always)]
fn start(ctx: &TcContext, s: &mut Scratch, subject: &Subject, direction: u8, parsed: bool) -> bool {
    if !parsed && !tuple::parse(ctx, s) {
        return false;
    }
    // SAFETY: a `POLICY_ENDPOINTS` value and the scratch value's copy: apart. Not an
    // assignment, which compiled to a call of a byte-by-byte `memmove` (32 rounds of its loop).
    unsafe { core::ptr::copy_nonoverlapping(subject.endpoint, &raw mut s.subject, 1) };
    s.direction = direction;
    tuple::own(s, direction == POLICY_DIRECTION_EGRESS);
    true
}

/// The check of the key [`start`] read: a cached verdict, or a new flow's.
#[inline(always)]
fn finish(ctx: &TcContext, s: &mut Scratch) -> bool {
    // An ICMP error about a flow passes where the flow's replies pass (keyed as one); any
    // other is judged as itself. A quote that cannot be read keys nothing (family 0).
    if s.icmp_error != 0 {
        quote(ctx, s);
    }
    if cached(s) {
        return true;
    }
    if s.icmp_error != 0 {
        unquote(ctx, s);
    }
    judge(ctx, s)
}

/// Keys an ICMP error as a reply of the flow it quotes; one whose quote cannot be read keys
/// nothing (family 0). Not inlined, nor [`unquote`]: `from_pod`'s frame leaves `allows` 64
/// bytes of stack, and these calls take none.
#[inline(never)]
fn quote(ctx: &TcContext, s: &mut Scratch) {
    if !tuple::inner(ctx, s) {
        s.key.family = 0;
    }
}

/// The ICMP error's own key again, to be judged as itself.
#[inline(never)]
fn unquote(ctx: &TcContext, s: &mut Scratch) {
    tuple::parse(ctx, s);
    tuple::own(s, s.direction == POLICY_DIRECTION_EGRESS);
}

/// Whether a live entry of the packet's key has the bit this check needs; one that has lives on.
#[inline(always)]
fn cached(s: &mut Scratch) -> bool {
    if tuple::opens(s) {
        return false;
    }
    let now = clock::now(s);
    let Some(entry) = flows::live(&s.key, now, s.subject.owner) else { return false };
    // SAFETY: an LRU value, valid while this program runs.
    let flags = unsafe { (*entry).flags };
    // The opener's side for a packet out of the opener or into it; the responder's else.
    let original = flags & POLICY_FLOW_ORIGINAL != 0;
    let egress = s.direction == POLICY_DIRECTION_EGRESS;
    let mut needed = if egress == original { POLICY_FLOW_OPENER_OK } else { POLICY_FLOW_RESPONDER_OK };
    // A reply into the opener, to what it sent the stack.
    if !egress && !original {
        needed |= POLICY_FLOW_VIA_STACK;
    }
    if flags & needed == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { flows::touch(entry, now, tuple::closes(s)) };
    true
}

/// A new flow's verdict (see the module's comment); remembers an allowed one. What this node
/// itself sends (`IDENTITY_HOST`: kubelet's probes) is always allowed in.
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
        verdict = if !egress && peer == IDENTITY_HOST && sent_by_the_node(ctx, s) {
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
    // A flow between two subjects of this node gets one entry, the pair entry, once the
    // receiver's check allows it too (`pair.rs`): `from_pod`'s check leaves its entries for
    // then, and the receiver's writes none of its own.
    if s.pairing == pair::FROM_POD {
        flows::prepare(s, original, side, slot);
        s.deferred = 1;
    } else if s.pair_pending == 0 {
        flows::remember(s, original, side, slot);
    }
    true
}

/// Whether a packet from one of the node's addresses is the node's own (kubelet's probes): the
/// node sent it (no interface it arrived on), or the pod itself did and the stack's NAT gave it
/// the node's address on its way back (a hairpin through its own NodePort). Anything else the
/// stack forwarded with the node's address was masqueraded (kube-proxy's NodePort: any client,
/// another pod or the LAN, behind it) or forged on the LAN (IPv6 has no martian-source check):
/// judged by the rules like any peer, with the node's address's identity.
#[inline(always)]
fn sent_by_the_node(ctx: &TcContext, s: &Scratch) -> bool {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    let arrived_on = unsafe { (*ctx.skb.skb).ingress_ifindex };
    arrived_on == 0 || arrived_on == s.subject.ifindex
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

/// A packet an ingress-isolated pod sends to the node's stack (`from_pod`): remembered with
/// `POLICY_FLOW_VIA_STACK`, so that its replies, which the stack may translate back (from a
/// Service address), come in. Its egress verdict is taken where the stack forwards it.
#[inline(always)]
pub fn note_via_stack(ctx: &TcContext, subject: &Subject) {
    policy_note_via_stack(ctx.skb.skb, subject.endpoint);
}

/// [`note_via_stack`] as a BPF global function, verified once per program (see
/// [`policy_allows`]); returns 0.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn policy_note_via_stack(skb: *mut __sk_buff, endpoint: *const PolicyEndpoint) -> u32 {
    // SAFETY: a `POLICY_ENDPOINTS` value, valid while this program runs, or null.
    if let Some(endpoint) = unsafe { endpoint.as_ref() } {
        note(&TcContext::new(skb), &Subject { endpoint });
    }
    0
}

#[inline(always)]
fn note(ctx: &TcContext, subject: &Subject) {
    let Some(s) = scratch::get() else { return };
    // SAFETY: this CPU's scratch value, used by this program run alone.
    let s = unsafe { &mut *s };
    s.vouch = 0;
    if !tuple::parse(ctx, s) {
        return;
    }
    // SAFETY: a `POLICY_ENDPOINTS` value and the scratch value's copy: apart. Not an
    // assignment, which compiled to a call of a byte-by-byte `memmove` (32 rounds of its loop).
    unsafe { core::ptr::copy_nonoverlapping(subject.endpoint, &raw mut s.subject, 1) };
    s.direction = POLICY_DIRECTION_EGRESS;
    tuple::own(s, true);
    let now = clock::now(s);
    if !tuple::opens(s)
        && let Some(entry) = flows::live(&s.key, now, s.subject.owner)
    {
        // SAFETY: an LRU value, valid while this program runs.
        unsafe {
            if (*entry).flags & POLICY_FLOW_ORIGINAL != 0 && (*entry).flags & POLICY_FLOW_VIA_STACK != 0 {
                flows::touch(entry, now, tuple::closes(s));
                return;
            }
        }
    }
    flows::remember(s, true, POLICY_FLOW_VIA_STACK, 0);
}
