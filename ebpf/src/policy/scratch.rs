//! The check's working memory: a per-CPU map value, not the stack. `to_uplink` calls the check
//! with 464 of its 512 bytes of stack in use, and a call's frame counts against the same 512:
//! the 5-tuple (40 bytes), the trie keys and the entry to write would not fit beside it.
use aya_ebpf::maps::lpm_trie::Key;
use ebpf_common::{FlowKey, IpKey, PolicyEndpoint, PolicyFlow, PolicyRuleKey};

use ebpf_common::{POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED, POLICY_INGRESS_ISOLATED};

use crate::maps;

impl Scratch {
    /// Whether the subject is isolated in `direction`.
    #[inline(always)]
    pub fn isolated(&self, direction: u8) -> bool {
        let bit = if direction == POLICY_DIRECTION_INGRESS { POLICY_INGRESS_ISOLATED } else { POLICY_EGRESS_ISOLATED };
        self.subject.flags & bit != 0
    }

    /// The `POLICY_COUNTS` slot a denied flow this check's way is counted on.
    #[inline(always)]
    pub fn denied_slot(&self) -> u32 {
        if self.direction == POLICY_DIRECTION_INGRESS { self.subject.ingress_slot } else { self.subject.egress_slot }
    }
}

/// What the check holds between helper calls is here too (the subject, the direction), not in
/// registers: BPF has four that survive a call, and the rest spill onto the stack.
#[repr(C)]
pub struct Scratch {
    /// The pod the check is for (a copy of its `POLICY_ENDPOINTS` slot).
    pub subject: PolicyEndpoint,
    /// The packet's 5-tuple (turned around in place for its reply's key).
    pub key: FlowKey,
    /// The entry being written.
    pub flow: PolicyFlow,
    pub identity: Key<IpKey>,
    /// `POLICY_BUDGETS`' key (`budget.rs`); its new value is the last field.
    pub budget_owner: u64,
    pub rule: Key<PolicyRuleKey>,
    /// The packet's IP header (IPv4's first 20 bytes, or IPv6's 40), then the first 16 bytes
    /// of its L4 header: read here, not onto the stack.
    pub ip: [u8; 40],
    pub l4: [u8; 16],
    /// FIN, SYN, RST, ACK in the wire's bit positions; 0 for other protocols.
    pub tcp_flags: u8,
    /// `POLICY_DIRECTION_INGRESS` or `POLICY_DIRECTION_EGRESS`.
    pub direction: u8,
    /// The packet is an ICMP error (`tuple::inner` reads the packet it is about).
    pub icmp_error: u8,
    /// `from_pod`'s word to `deliver::into_pod` in the same program run (`pair.rs`): `VOUCHED`,
    /// `PENDING` or 0, for the packet from `vouch_sender` (host ifindex) to `vouch_receiver`
    /// of owner `vouch_receiver_owner`. Every check clears it; only that delivery takes it.
    pub vouch: u8,
    /// `deliver::into_pod`'s check is to write the pair entry, and none of its own, if it
    /// allows the flow.
    pub pair_pending: u8,
    /// The check's `pairing` (`verdict::allows`).
    pub pairing: u8,
    /// `from_pod`'s check allowed a new flow whose entries (`flow`, for `key`) wait for the
    /// receiver's check: the pair entry stands for both (`pair.rs`).
    pub deferred: u8,
    /// `key` holds this packet's tuple, read by `pair::cached` for `from_pod`'s check.
    pub parsed: u8,
    /// What `budget::admit` is asked for: entries, and the direction that pays.
    pub budget_entries: u8,
    pub budget_direction: u8,
    pub pad: [u8; 2],
    /// The flow's key in `pair.rs`'s orientation.
    pub pair_key: FlowKey,
    pub vouch_sender: u32,
    pub vouch_receiver: u32,
    pub vouch_sender_owner: u64,
    pub vouch_receiver_owner: u64,
    /// `clock.rs`: the tick (`jiffies`) of the last clock read on this CPU, and that read.
    pub clock_tick: u64,
    pub clock_ns: u64,
    /// A new `POLICY_BUDGETS` value: last, so that the fields every check uses keep their
    /// places (cache lines) whatever its size.
    pub budget: super::budget::Budget,
}

/// This CPU's scratch value; only this program run uses it.
#[inline(always)]
pub fn get() -> Option<*mut Scratch> {
    maps::POLICY_SCRATCH.get_ptr_mut(0)
}

/// Writes `flow` over a `POLICY_FLOWS` value a word at a time: an assignment compiled to a call
/// of a byte-by-byte `memmove`, 24 rounds of a loop the verifier walked in every program. Each
/// field is written whole: a reader on another CPU sees its old or its new value.
///
/// # Safety
/// `entry` is a `POLICY_FLOWS` value (8-aligned, as `flow`).
#[inline(always)]
pub unsafe fn put_flow(entry: *mut PolicyFlow, flow: &PolicyFlow) {
    let (to, from) = (entry.cast::<u64>(), core::ptr::from_ref(flow).cast::<u64>());
    for i in 0..size_of::<PolicyFlow>() / 8 {
        // SAFETY: by the caller; 24 bytes each.
        unsafe { to.add(i).write_volatile(from.add(i).read_volatile()) };
    }
}

/// Copies an address four bytes at a time: LLVM makes a `memcpy` call of a plain array copy
/// here, whose saved registers cost stack.
///
/// # Safety
/// Both point at 4-aligned addresses of the scratch value (the fields above are).
#[inline(always)]
pub unsafe fn copy16(to: *mut [u8; 16], from: *const [u8; 16]) {
    let (to, from) = (to.cast::<u32>(), from.cast::<u32>());
    // SAFETY: by the caller.
    unsafe {
        *to = *from;
        *to.add(1) = *from.add(1);
        *to.add(2) = *from.add(2);
        *to.add(3) = *from.add(3);
    }
}

/// An IPv4 address as the first word of a 16-byte one, the rest zero (as `memset` would).
///
/// # Safety
/// As for [`copy16`].
#[inline(always)]
pub unsafe fn set_v4(to: *mut [u8; 16], word: u32) {
    let to = to.cast::<u32>();
    // SAFETY: by the caller.
    unsafe {
        *to = word;
        *to.add(1) = 0;
        *to.add(2) = 0;
        *to.add(3) = 0;
    }
}
