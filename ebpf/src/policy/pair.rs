//! One entry and one lookup for both checks of a flow between two pods of this node that are
//! both policy subjects: `from_pod` judges the sender's egress and `deliver::into_pod`, in the
//! same program run, the receiver's ingress. Once both allowed a new flow, the flow gets one
//! entry, the pair entry (`POLICY_FLOW_KEY_PAIR`: keyed in one orientation, the lower address
//! and port first, so that the replies find it too; owned by the two owners XORed, so that a
//! pod at either address that is not the one that was judged finds nothing), and neither pod
//! gets entries of its own for it: `from_pod`'s check leaves its entries pending (`deferred`)
//! and the receiver's writes none. A later packet of the flow, either way, finds the pair
//! entry in `from_pod`, and `from_pod` vouches to `into_pod` (in the per-CPU scratch value: a
//! program run is never interrupted by another on its CPU) that the receiver's check is done
//! for this packet, for that receiver (host ifindex and owner) and this sender. The receiver's
//! check of a new flow reuses the tuple `from_pod`'s read (the packet is the same one).
//!
//! Both checks passing for one packet means both pass for the flow's replies too: each check's
//! verdict holds for both directions (`flows.rs`). A TCP SYN never rides on the pair entry
//! (both checks judge it, as always). An ICMP error rides on the pair entry of the flow it
//! quotes, as it would on the pods' own entries (which such a flow does not have): it passes
//! where the flow's replies pass, and never writes anything.
//! The pair entry is paid from the sender's bucket for pair entries: one entry; a packet other
//! than a TCP SYN writes none to a pod over that budget, whose flow it may answer (`budget.rs`:
//! who pays). It ages
//! like the pods' entries; when it goes, each check judges again (a TCP segment in its own
//! direction or as a reply; a UDP datagram in its own direction).
//!
//! The vouch is taken by the delivery it was made for or cleared by the next check on the CPU,
//! whichever comes first; `from_pod` clears it itself when it sends the packet to the stack
//! after all (`unvouch`: the sender's pending entries are written then, for the checks the
//! stack's path makes), and never vouches for a delivery that skips the check (a pod with an
//! egress limit at either end). A receiver's check that denies leaves nothing: the packet is
//! dropped, and the sender's verdict is not kept either.
use aya_ebpf::{bindings::BPF_ANY, programs::TcContext};
use ebpf_common::{POLICY_FLOW_CLOSING, POLICY_FLOW_KEY_PAIR};

use super::{Subject, budget, clock, flows, scratch, scratch::Scratch, tuple};
use crate::{maps, packet};

/// `verdict::allows`' `pairing`: `from_pod`'s check of a packet to a subject of this node.
pub const FROM_POD: u8 = 1;
/// `deliver::into_pod`'s check.
pub const INTO_POD: u8 = 2;

/// `Scratch::vouch`: the pair entry allowed the packet; the receiver's check is done.
pub const VOUCHED: u8 = 1;
/// The sender's check allowed the packet's flow (its entry found, or its entries pending) and
/// no pair entry was found: the receiver's check, if it allows it too, writes the pair entry.
pub const PENDING: u8 = 2;

/// Whether the key's source (address, then port) is above its destination: the pair's key has
/// the lower end first. Any order both directions agree on does.
#[inline(always)]
fn reversed(s: &Scratch) -> bool {
    let (src, dst) = ((&raw const s.key.src_addr).cast::<u32>(), (&raw const s.key.dst_addr).cast::<u32>());
    for i in 0..4 {
        // SAFETY: 4-aligned words of the key (`scratch.rs`).
        let (a, b) = unsafe { (*src.add(i), *dst.add(i)) };
        if a != b {
            return a > b;
        }
    }
    s.key.src_port > s.key.dst_port
}

/// `s.pair_key`: the packet's key (`s.key`) in the pair's orientation. Word by word, with
/// volatile accesses: LLVM would otherwise load every word at once, and spill some onto the
/// stack, which the callers' frames leave none of.
#[inline(always)]
fn key(s: &mut Scratch) {
    let reversed = reversed(s);
    let from = (&raw const s.key).cast::<u32>();
    let to = (&raw mut s.pair_key).cast::<u32>();
    // Words: 0 family, protocol, pad; 1 ports; 2..6 source; 6..10 destination.
    // SAFETY: two `FlowKey`s of the scratch value, 40 bytes each, 4-aligned.
    unsafe {
        for i in 0..10 {
            let j = if !reversed || i < 2 {
                i
            } else if i < 6 {
                i + 4
            } else {
                i - 4
            };
            to.add(i).write_volatile(from.add(j).read_volatile());
        }
    }
    let p = &mut s.pair_key;
    p.pad = [POLICY_FLOW_KEY_PAIR, 0];
    if reversed {
        core::mem::swap(&mut p.src_port, &mut p.dst_port);
    }
    s.flow.owner = s.vouch_sender_owner ^ s.vouch_receiver_owner;
}

/// Whether the flow of the packet from `sender` to `receiver` has a live pair entry: then
/// `from_pod` vouches for the packet to `receiver`'s check. One that has lives on. An ICMP
/// error: the flow it quotes. A TCP SYN, a packet no policy judges: false (the checks see to
/// them). Inlined into `verdict::policy_allows_pair`, whose frame it has to itself.
#[inline(always)]
pub fn cached(ctx: &TcContext, sender: &Subject, receiver: &Subject) -> bool {
    let Some(s) = scratch::get() else { return false };
    // SAFETY: this CPU's scratch value, used by this program run alone.
    let s = unsafe { &mut *s };
    s.vouch = 0;
    s.vouch_sender = packet::ingress_ifindex(ctx);
    s.vouch_sender_owner = sender.endpoint.owner;
    s.vouch_receiver = receiver.endpoint.ifindex;
    s.vouch_receiver_owner = receiver.endpoint.owner;
    s.parsed = u8::from(tuple::parse(ctx, s));
    if s.parsed == 0 || tuple::opens(s) {
        return false;
    }
    // An ICMP error about the flow (port unreachable, fragmentation needed) passes where the
    // flow's replies pass: keyed as the packet it quotes, whose pair entry holds both checks'
    // verdicts (the pods have no entries of their own to find it by). The tuple read is then
    // no longer the packet's own: the checks read it again if this misses.
    if s.icmp_error != 0 {
        s.parsed = 0;
        if !quoted(ctx, s) {
            return false;
        }
    }
    key(s);
    let now = clock::now(s);
    let Some(entry) = flows::live(&s.pair_key, now, s.flow.owner) else { return false };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe { flows::touch(entry, now, tuple::closes(s)) };
    s.vouch = VOUCHED;
    true
}

/// Keys the ICMP error in `s` as the reply of the packet it quotes (`tuple::inner`). Not
/// inlined: the pair check's frame (`verdict::policy_allows_pair`) has no stack for it.
#[inline(never)]
fn quoted(ctx: &TcContext, s: &mut Scratch) -> bool {
    tuple::inner(ctx, s)
}

/// Takes `from_pod`'s vouch that the pair entry allowed this packet, if it is for this
/// delivery: into the pod behind host veth `ifindex` of attachment `owner` (`deliver::into_pod`'s
/// `ENDPOINTS` entry, whose `POLICY_ENDPOINTS` entry `cached` was given), from the veth the packet
/// arrived on. Read before the receiver's entry, its global function and its check: an
/// established flow's packet needs none of them. Any other vouch is left to the check, which
/// clears it.
#[inline(always)]
pub fn take_vouch(ctx: &TcContext, ifindex: u32, owner: u64) -> bool {
    let Some(s) = scratch::get() else { return false };
    // SAFETY: this CPU's scratch value, used by this program run alone.
    let s = unsafe { &mut *s };
    let for_this = s.vouch == VOUCHED
        && s.vouch_receiver == ifindex
        && s.vouch_receiver_owner == owner
        && s.vouch_sender == packet::ingress_ifindex(ctx);
    if for_this {
        s.vouch = 0;
    }
    for_this
}

/// Whether `from_pod`'s vouch (`s.vouch` set) is for this packet's delivery into `receiver`.
#[inline(always)]
pub fn vouched_for(ctx: &TcContext, s: &Scratch, receiver: &Subject) -> bool {
    s.vouch_receiver == receiver.endpoint.ifindex
        && s.vouch_receiver_owner == receiver.endpoint.owner
        && s.vouch_sender == packet::ingress_ifindex(ctx)
}

/// Writes the pair entry of the flow of `s.key`, for the vouch's pods: one entry, paid from
/// the sender's bucket for pair entries (`budget.rs`). An entry the key already has (its ports used
/// again: a client's next connection from the same port, the old one closing) is written over
/// in place: no new entry, nothing evicted, so nothing to pay; and cheaper than an insert,
/// which takes a free node of the LRU (cold memory) and gives the old one back.
#[inline(never)]
pub fn remember(s: &mut Scratch) {
    key(s);
    s.flow.last_seen_ns = clock::now(s);
    s.flow.slot = 0;
    s.flow.flags = if tuple::closes(s) { POLICY_FLOW_CLOSING } else { 0 };
    if let Some(entry) = maps::POLICY_FLOWS.get_ptr_mut(&s.pair_key) {
        // SAFETY: an LRU value, valid while this program runs; a reader on another CPU sees
        // the old or the new value of each field, either of them a live entry of this flow.
        unsafe { scratch::put_flow(entry, &s.flow) };
        return;
    }
    // Not the opener's SYN: it may answer a flow the receiver opened and could not pay for;
    // while the receiver is over its budget, nothing is written (`budget.rs`: who pays).
    if !tuple::opens(s) {
        s.budget_owner = s.vouch_receiver_owner;
        if budget::over(s) {
            return;
        }
    }
    s.budget_owner = s.vouch_sender_owner;
    s.budget_direction = budget::PAIRS;
    s.budget_entries = 1;
    if budget::admit(s) {
        let _ = maps::POLICY_FLOWS.insert(&s.pair_key, &s.flow, u64::from(BPF_ANY));
    }
}

/// `from_pod` sends the packet to the node's stack after all: no delivery takes the vouch, and
/// the sender's check writes the entries it left for the receiver's (`flows::keep_deferred`).
#[inline(always)]
pub fn unvouch() {
    if let Some(s) = scratch::get() {
        // SAFETY: this CPU's scratch value, used by this program run alone.
        let s = unsafe { &mut *s };
        if s.vouch == PENDING && s.deferred != 0 {
            flows::keep_deferred(s);
        }
        s.vouch = 0;
    }
}
