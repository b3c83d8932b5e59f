//! One pod's share of `POLICY_FLOWS`: the entries written for it are paid from a token bucket
//! per owner and direction (flows it opens; flows opened to it), of `POLICY_NEW_ENTRIES_PER_SECOND`
//! entries a second and as many at once. A rate, not a count of the entries a pod holds: the
//! LRU forgets entries silently, so a held count could only drift up (as `pod_flows.rs`
//! explains for masquerading).
//!
//! The rate, against the table: a flow between two subjects of this node costs one entry (its
//! pair entry, paid by the opener (below): `pair.rs`; nothing when its key is there already and is
//! written over in place), any other flow two (its subject's, each direction). A pod at full
//! tilt both ways writes at most 2 × 16,384 entries a second, so that alone it needs 8 s to
//! write as many entries as the table's 262,144 (7 s from two full buckets). The kernel's LRU
//! gives an entry looked up since its last pass another round, so a flow with a packet every
//! few seconds keeps its entry through one pod's churn; an idle one that is pushed out is
//! judged again on its next packet (TCP in its own direction or as a reply, UDP in its own
//! direction). And the rate is above what one pod opens when it opens connections as fast as
//! it can: one client thread, one connection at a time, makes ~15,000 pod → pod connections
//! a second on the bench's VM, each one entry. The earlier 1,000 flows a second per pod and
//! direction left 93 % of those flows unremembered, every packet of them judged in full
//! (bench/results/2026-11-28-policy.md: 0.93× the connections without policy).
//! Many pods churning at once are bounded only by their sum, as conntrack's table is.
//!
//! The bucket is GCRA's form: one time per direction, when the bucket is full again; an entry
//! moves it on by 1/rate, and none fits when it would lie more than a bucket ahead of now.
//! Any span of W seconds admits at most (1 + W) × 16,384 entries a direction.
//!
//! Who pays: a pod's buckets are spent by its own packets alone. Its own entries are paid by
//! its own checks, from the bucket of their direction; a pair entry by the packet that writes
//! it, from that packet's sender's third bucket, for pair entries alone (`PAIRS`). The pair
//! entry is written by the first packet of the flow that both checks allow: the opener's,
//! unless the opener's pair bucket refused it; then an answer of the peer (a SYN-ACK, a UDP
//! reply, TCP data) would write it, paid by the peer, so that a pod opening flows to its node's
//! pods faster than its budget would spend its peers' budgets. Hence a pod whose pair bucket
//! refused an entry within the last second is over ([`over`]), and while it is, no packet to
//! it writes a pair entry, unless it is a TCP SYN: its sender opens the flow, which is its own
//! to pay for. Any other packet of a flow without an entry (TCP without SYN, UDP, ICMP) may
//! open it or answer it, with nothing to tell which; to a pod that is over it is taken as an
//! answer to one of the flows that pod could not pay for. Over is a time of refusal, not a
//! peek at the bucket: a flooder's bucket refills an entry at a time, so "has room now" holds
//! between its packets, and every answer that came in then would be paid by the answerer (its
//! entries' count, unbounded, against one token of the flooder's). The pair bucket is its own
//! so that only the pod's own packets to its node's pods can make it over: traffic from
//! elsewhere (another node's clients, a pod no policy isolates) spends the pod's ingress and
//! egress buckets, and its answers to that traffic the egress bucket, none of them the pair
//! bucket; were it shared, a busy server would be over, and its same-node clients' flows to it
//! (a DNS query, a ping) would go uncached, their replies judged on their own. The third bucket
//! raises one pod's bound to 3 × 16,384 entries a second: alone it needs 5.3 s to write the
//! table's worth.
//!
//! Against a flooder: as the opener (a floods b), a's packets pay from a's bucket and, past
//! it, a is over for as long as it floods and a second after; b's answers write nothing and
//! b pays nothing. As the sender of anything else (b sends a answers, forged SYN-ACKs, its own
//! flows), b pays from b's bucket; the receiver never pays. A pod cannot make another over:
//! a bucket refuses only its own pod's entries. On two CPUs: the refusal is written before
//! the packet is delivered, so an answer, which comes after it, sees it on any CPU. What it
//! costs: while a pod is over, its peers' flows to it other than TCP connections (a UDP flow,
//! a TCP segment after its entry went) are not remembered either, as its own are not: judged
//! packet by packet, their replies by the rules of their own direction. What is left: an
//! answer sent more than a second after the flooder's last refused entry (a server pushing
//! data, or closing, on an idle connection the flooder opened while over) is paid by the
//! answerer, at the answerer's own sending rate.
//!
//! Over the budget a flow is still judged and let through, only not remembered: each of its
//! packets pays the full check. Dropping it instead would turn a busy pod's allowed traffic
//! into drops; not remembering costs only the cache. Plain read-modify-writes: two CPUs
//! admitting one pod's flows in the same instant can lose a count (a little lenient).
use aya_ebpf::bindings::BPF_NOEXIST;
use ebpf_common::{POLICY_DIRECTION_EGRESS, POLICY_NEW_ENTRIES_PER_SECOND};

use super::{clock, scratch::Scratch};
use crate::maps;

/// What one entry moves the bucket's time on by.
const NS_PER_ENTRY: u64 = 1_000_000_000 / POLICY_NEW_ENTRIES_PER_SECOND as u64;
/// How far ahead of now the time may lie: a full bucket, a second's entries.
const BURST_NS: u64 = 1_000_000_000;

/// How long a pod is over its budget after its bucket refused an entry (`over`).
const OVER_NS: u64 = 1_000_000_000;

/// `Scratch::budget_direction` for the pair entries' bucket (beside the policy directions).
pub const PAIRS: u8 = 0xff;

/// Value of `POLICY_BUDGETS` (not pinned: its layout is this build's).
#[repr(C)]
pub struct Budget {
    /// When each bucket (ingress, egress, pair entries) is full again.
    pub full_at_ns: [u64; 3],
    /// When each bucket last refused an entry (0: never).
    pub refused_at_ns: [u64; 3],
}

/// Whether the pod of `s.budget_owner` may have `s.budget_entries` more entries written in
/// `s.budget_direction` now; pays for them if so. Asked and answered in the scratch value,
/// the clock read after the lookup: this frame takes no stack (the callers' leave none).
#[inline(never)]
pub fn admit(s: &mut Scratch) -> bool {
    let budget = maps::POLICY_BUDGETS.get_ptr_mut(&s.budget_owner);
    let now = clock::now(s);
    let way = match s.budget_direction {
        PAIRS => 2,
        POLICY_DIRECTION_EGRESS => 1,
        _ => 0,
    };
    let cost = u64::from(s.budget_entries) * NS_PER_ENTRY;
    let Some(budget) = budget else {
        // Field by field: a whole value would be built on the stack first.
        s.budget.full_at_ns = [now; 3];
        s.budget.full_at_ns[way] = now + cost;
        s.budget.refused_at_ns = [0; 3];
        // A concurrent insert wins, and these entries go unpaid.
        let _ = maps::POLICY_BUDGETS.insert(&s.budget_owner, &s.budget, u64::from(BPF_NOEXIST));
        return true;
    };
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        let full_at = &mut (*budget).full_at_ns[way];
        let after = if *full_at > now { *full_at } else { now } + cost;
        if after - now > BURST_NS {
            // Once a tick of the coarse clock: the flooder's CPUs need not share the line.
            if (*budget).refused_at_ns[way] != now {
                (*budget).refused_at_ns[way] = now;
            }
            return false;
        }
        *full_at = after;
    }
    true
}

/// Whether the pod of `s.budget_owner` is over its pair entries' budget: that bucket refused
/// one of its entries within the last second. Asked like [`admit`], and takes no stack either.
#[inline(never)]
pub fn over(s: &mut Scratch) -> bool {
    let Some(budget) = maps::POLICY_BUDGETS.get_ptr(&s.budget_owner) else { return false };
    let now = clock::now(s);
    // SAFETY: an LRU value, valid while this program runs.
    let refused = unsafe { (*budget).refused_at_ns[2] };
    refused != 0 && now.saturating_sub(refused) < OVER_NS
}
