//! NetworkPolicy enforcement (ebpf-common's `policy.rs` is the contract with the agent).
//!
//! - `subject.rs`: the pod a check is for (`POLICY_ENDPOINTS`): the only map read for a pod no
//!   policy isolates, whose packets go on at once.
//! - `tuple.rs`: the packet's 5-tuple, as `POLICY_FLOWS` keys it.
//! - `identity.rs`: the peer's identity (`POLICY_IDENTITIES`).
//! - `rules.rs`: whether an isolated subject's rules allow a new flow (`POLICY_RULES`).
//! - `flows.rs`: the cached verdicts of allowed flows (`POLICY_FLOWS`): aging, closing.
//! - `budget.rs`: how many `POLICY_FLOWS` entries one pod may have written per second (a token
//!   bucket per direction).
//! - `pair.rs`: one entry and one lookup for both checks of a flow between two subjects of this
//!   node.
//! - `verdict.rs`: the checks themselves, and what a verdict counts and reports.
//! - `clock.rs`: the checks' clock, read once per tick on each CPU.
//! - `scratch.rs`: the checks' working memory (a per-CPU map value: the callers' frames leave
//!   them little stack).
//!
//! Where: egress in `from_pod` (both families) for packets to pods, in `to_uplink(6)` and
//! `to_pod` for a pod's packets the node's stack forwarded (the outside, Services kube-proxy
//! translated: judged against the backend); ingress in `deliver::into_pod` (same node, other
//! nodes, per-packet Services by way of [`after_translation`]) and `to_pod` (whatever the
//! stack delivers). A pod some policy isolates for ingress also has what it hands the stack
//! noted (`POLICY_FLOW_VIA_STACK`), for the replies the stack translates back.
pub mod budget;
mod clock;
mod flows;
mod identity;
mod pair;
mod rules;
pub mod scratch;
pub mod subject;
mod tuple;
pub mod verdict;

pub use pair::unvouch;
pub use subject::Subject;

use aya_ebpf::programs::TcContext;
use ebpf_common::{ENDPOINT_EGRESS_SHAPED, Endpoint, POLICY_DIRECTION_EGRESS, POLICY_DIRECTION_INGRESS};

use crate::{packet, sender::Sender};

/// Whether the packet `from_pod` has in hand may leave the pod (`own`'s) behind the veth it
/// arrived on, for `to`, the pod of this node it goes to, if any. A pod no policy isolates:
/// one array read. Two subjects: both checks in one lookup once the flow is known (`pair.rs`);
/// not for a pod with an egress limit at either end (the stack delivers, and `to_pod` checks).
#[inline(always)]
pub fn egress_allowed(ctx: &TcContext, own: &Sender, to: Option<*const Endpoint>) -> bool {
    let Some(sender) = subject::of_veth(packet::ingress_ifindex(ctx), Some(own.owner)) else { return true };
    // SAFETY: a hash map value, valid while this program runs.
    let receiver = to.map(|p| unsafe { &*p }).filter(|p| (own.flags | p.flags) & ENDPOINT_EGRESS_SHAPED == 0);
    match receiver.and_then(|p| subject::of_veth(p.host_ifindex, Some(p.owner))) {
        Some(receiver) => verdict::allows_pair(ctx, &sender, &receiver),
        None => verdict::allows(ctx, &sender, POLICY_DIRECTION_EGRESS, 0),
    }
}

/// A packet `from_pod` hands the node's stack: an ingress-isolated sender's flow is noted, for
/// its replies (`verdict::note_via_stack`). Others: one array read.
#[inline(always)]
pub fn note_via_stack(ctx: &TcContext, owner: u64) {
    if let Some(subject) = subject::of_veth(packet::ingress_ifindex(ctx), Some(owner))
        && subject.endpoint.flags & ebpf_common::POLICY_INGRESS_ISOLATED != 0
    {
        verdict::note_via_stack(ctx, &subject);
    }
}

/// Whether the packet may go into the pod behind host veth `ifindex` (of attachment `owner`,
/// when known).
#[inline(always)]
pub fn ingress_allowed(ctx: &TcContext, ifindex: u32, owner: Option<u64>) -> bool {
    // An established flow between two subjects: `from_pod` found its pair entry and vouched for
    // this delivery (`pair.rs`), which then costs no more than that.
    if let Some(owner) = owner
        && pair::take_vouch(ctx, ifindex, owner)
    {
        return true;
    }
    match subject::of_veth(ifindex, owner) {
        // A delivery (`deliver::into_pod`): `from_pod` may have vouched for this packet.
        Some(subject) if owner.is_some() => verdict::allows(ctx, &subject, POLICY_DIRECTION_INGRESS, pair::INTO_POD),
        Some(subject) => verdict::allows(ctx, &subject, POLICY_DIRECTION_INGRESS, 0),
        None => true,
    }
}

/// What the node's stack forwards (`to_pod`, `to_uplink`): the egress of the pod it came from,
/// found by the veth it entered the node on (`ingress_ifindex`; `from_pod` made sure its
/// source is that pod's). Translated by then (kube-proxy's DNAT): judged against the backend.
#[inline(always)]
pub fn forwarded_egress_allowed(ctx: &TcContext) -> bool {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    let arrived_on = unsafe { (*ctx.skb.skb).ingress_ifindex };
    match subject::of_veth(arrived_on, None) {
        Some(subject) => verdict::allows(ctx, &subject, POLICY_DIRECTION_EGRESS, 0),
        None => true,
    }
}

/// A verdict beside the TC actions, from the per-packet Service programs' deep frames: the
/// packet is translated, to a local backend some policy isolates, whose check the frame has no
/// stack left for. The program's entry delivers it ([`after_translation`]).
pub const DEFERRED: i32 = i32::MIN + 2;

/// At a Service program's entry: a [`DEFERRED`] packet delivered into its backend, checked.
#[inline(always)]
pub fn after_translation(ctx: &TcContext, verdict: i32) -> i32 {
    if verdict == DEFERRED { deliver_translated(ctx) } else { verdict }
}

#[inline(never)]
fn deliver_translated(ctx: &TcContext) -> i32 {
    use ebpf_common::{DropReason, ForwardPath, IpKey};
    let key = if crate::flow::is_ipv6(ctx) {
        let Ok(dst) = ctx.load::<[u8; 16]>(network_types::eth::EthHdr::LEN + 24) else {
            return crate::maps::drop(ctx, DropReason::Malformed);
        };
        IpKey::v6(dst)
    } else {
        let Ok((_, dst)) = crate::flow::addresses(ctx) else {
            return crate::maps::drop(ctx, DropReason::Malformed);
        };
        IpKey::v4(dst)
    };
    match crate::maps::endpoint(&key) {
        Some(pod) => crate::deliver::into_pod(ctx, &pod, ForwardPath::ServiceTranslated),
        // Gone since: nowhere to deliver.
        None => crate::maps::drop(ctx, DropReason::NotAPod),
    }
}
