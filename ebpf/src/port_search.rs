//! The search for a free masquerade port, shared by both families (`snat.rs`, `snat6.rs`).
//!
//! Each flow has a reply entry in `NAT` keyed by the reply as it will arrive (outside → node
//! address, masquerade port): inserting it with `BPF_NOEXIST` is the atomic "is this port free
//! for this destination" test, so two CPUs never hand out the same port.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    cty::c_void,
    helpers::{bpf_get_prandom_u32, bpf_loop},
};
use ebpf_common::{
    DatapathConfig, FlowKey, IpKey, NAT_PORT_TRIES, NAT_TIMEOUT_ICMP_NS, NAT_TIMEOUT_TCP_CLOSING_NS,
    NAT_TIMEOUT_TCP_NS, NAT_TIMEOUT_UDP_NS, NatEntry,
};

use crate::{
    flow::{PROTO_ICMP, PROTO_TCP},
    flow6::PROTO_ICMPV6,
    maps, node_echoes,
};

/// Searches a caller keeps across tries for one new flow: at most this many, each ending at its
/// first claim; a port a node socket holds is given back and the next search leaves it out.
/// With a share `f` of a large range held by node sockets a new flow fails with probability
/// about `f` to the power of `SOCKET_SEARCHES`.
pub const SOCKET_SEARCHES: usize = 4;

/// One flow's search, in the caller's frame; `bpf_loop` hands the callback a pointer to it.
/// It holds the reply key and entry whole, so the callback builds nothing on its own frame
/// (the caller's frame and the callback's share the 512-byte stack).
pub struct PortSearch {
    /// The reply's key; `dst_port` is the candidate port of the moment.
    pub key: FlowKey,
    /// What the reply entry says: the pod's address and port, the owner, the time.
    pub reply: NatEntry,
    port_min: u16,
    /// The claimed port, 0 while none is.
    found: u16,
    span: u32,
    /// The offset in the range of a port the next search leaves out, `span` for none.
    skip: u32,
}

impl PortSearch {
    #[inline(always)]
    pub fn new(key: FlowKey, reply: NatEntry, config: &DatapathConfig) -> Self {
        let span = u32::from(config.port_max.saturating_sub(config.port_min)) + 1;
        Self { key, reply, port_min: config.port_min, found: 0, span, skip: span }
    }

    /// Up to `NAT_PORT_TRIES` random ports of the range, through `bpf_loop`: the verifier checks
    /// the callback once, where an open-coded loop made it walk every iteration into everything
    /// after it (114,399 instructions verified, ~90 ms of every first load, against 3,279).
    /// The port claimed, if any; its reply entry is in `NAT`.
    #[inline(always)]
    pub fn next(&mut self) -> Option<u16> {
        self.found = 0;
        let context: *mut PortSearch = self;
        // SAFETY: the callback only reads and writes `self`, which outlives the call.
        unsafe { bpf_loop(NAT_PORT_TRIES, try_random_port as *mut c_void, context.cast(), 0) };
        (self.found != 0).then_some(self.found)
    }

    /// Gives `port` back (a node socket holds it) and leaves it out of the next search.
    #[inline(always)]
    pub fn give_back(&mut self, port: u16) {
        self.key.dst_port = port;
        let _ = maps::NAT.remove(&self.key);
        self.skip = u32::from(port.wrapping_sub(self.port_min));
    }
}

/// One try of [`PortSearch::next`]; returns 1 (stop) once a port is claimed. The first half of
/// the tries take only ports no flow holds: a port another flow left idle (or closed, 10 s ago)
/// is taken only when free ones are scarce, so a new connection rarely reuses a recent 4-tuple
/// (the server may still hold it in TIME_WAIT).
extern "C" fn try_random_port(index: u64, context: *mut c_void) -> i64 {
    // SAFETY: `next` passes its `PortSearch`, alive for the whole `bpf_loop` call.
    let search = unsafe { &mut *context.cast::<PortSearch>() };
    let Some(candidate) = random_candidate(search.port_min, search.span, search.skip) else { return 1 };
    let take_idle = index >= u64::from(NAT_PORT_TRIES / 2);
    search.key.dst_port = candidate;
    // ICMP identifiers and ports are never 0 on the wire for a real flow.
    if candidate != 0 && claim(&search.key, &search.reply, take_idle) {
        search.found = candidate;
        return 1;
    }
    0
}

/// A random port of the `span` ports from `port_min`, leaving out the one at offset `skip`
/// (`span` for none); `None` when that leaves nothing.
#[inline(always)]
fn random_candidate(port_min: u16, span: u32, skip: u32) -> Option<u16> {
    // SAFETY: plain helper call.
    let random = unsafe { bpf_get_prandom_u32() };
    // The skipped port is left out by drawing among one port fewer and stepping over it.
    let choices = span - u32::from(skip < span);
    if choices == 0 {
        return None;
    }
    let mut offset = random % choices;
    if offset >= skip {
        offset += 1;
    }
    Some(port_min.wrapping_add(offset as u16))
}

/// Takes the port of reply key `key` unless a live flow of another pod holds it (or an idle
/// one, unless `take_idle`). A port that is free is looked up before it is inserted: an insert
/// that fails on a full LRU map has already evicted another flow's entry to make room. A flow
/// whose owner no longer holds its pod's address (DEL leaves a deleted pod's flows to age)
/// holds nothing.
#[inline(always)]
fn claim(key: &FlowKey, reply: &NatEntry, take_idle: bool) -> bool {
    // An identifier the node's own ping to this destination uses (`node_echoes.rs`).
    if node_echoes::holds(key) {
        return false;
    }
    let Some(held) = maps::NAT.get_ptr(key) else {
        return maps::NAT.insert(key, reply, u64::from(BPF_NOEXIST)).is_ok();
    };
    // SAFETY: an LRU value, read field by field (a copy would cost stack the callback of
    // `next` does not have).
    let (ours, last_seen, closing) =
        unsafe { ((*held).addr == reply.addr && (*held).port == reply.port, (*held).last_seen_ns, (*held).closing) };
    let idle = take_idle && reply.last_seen_ns.saturating_sub(last_seen) > timeout(key.protocol, closing != 0);
    if !(ours || idle || orphaned(key.family, held)) {
        return false;
    }
    // Deleted, then inserted only if still absent: of two CPUs taking the same idle port, one
    // wins (overwriting in place would let both believe they had it).
    let _ = maps::NAT.remove(key);
    maps::NAT.insert(key, reply, u64::from(BPF_NOEXIST)).is_ok()
}

/// Whether the reply entry `held` belongs to an attachment that is gone.
#[inline(always)]
fn orphaned(family: u8, held: *const NatEntry) -> bool {
    // SAFETY: as in `claim`.
    let (addr, owner) = unsafe { ((*held).addr, (*held).owner) };
    let pod = IpKey { family, pad: [0; 3], addr };
    // SAFETY: a hash map value, read at once.
    maps::ENDPOINTS.get_ptr(&pod).is_none_or(|e| unsafe { (*e).owner } != owner)
}

#[inline(always)]
fn timeout(protocol: u8, closing: bool) -> u64 {
    match protocol {
        PROTO_TCP if closing => NAT_TIMEOUT_TCP_CLOSING_NS,
        PROTO_TCP => NAT_TIMEOUT_TCP_NS,
        PROTO_ICMP | PROTO_ICMPV6 => NAT_TIMEOUT_ICMP_NS,
        _ => NAT_TIMEOUT_UDP_NS,
    }
}
