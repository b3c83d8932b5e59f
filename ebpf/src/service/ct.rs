//! `SVC_CT`, our own connection tracking for Service translations (layout and lifetimes in
//! ebpf-common's `service_ct.rs`). Lookups honour an entry only while it is live for its state,
//! so an aged entry is as good as absent even before the LRU forgets it.
use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
};
use ebpf_common::{
    FlowKey, SVC_CT_CLOSING, SVC_CT_ESTABLISHED, SVC_CT_FORWARD, SVC_CT_NEW, SVC_CT_REPLY, SVC_CT_SYN_ACKED,
    SvcCtEntry, svc_ct_lifetime_ns,
};

use super::maps::SVC_CT;
use crate::flow::{PROTO_TCP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

/// `last_seen_ns` is written at most this often, so a busy flow does not dirty its entry's
/// cache line on every packet.
const TOUCH_NS: u64 = 1_000_000_000;

#[inline(always)]
fn live(entry: &SvcCtEntry, protocol: u8, now: u64) -> bool {
    now.wrapping_sub(entry.last_seen_ns) < svc_ct_lifetime_ns(protocol, entry.state)
}

/// The live entry for a packet with this key, as it is (a copy).
#[inline(always)]
pub fn find(key: &FlowKey) -> Option<SvcCtEntry> {
    // SAFETY: copied at once; entries are written whole or by single fields.
    let entry = unsafe { SVC_CT.get(key).copied() }?;
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    live(&entry, key.protocol, now).then_some(entry)
}

/// Whatever is stored under `key` is no live flow (free to take).
#[inline(always)]
fn free(key: &FlowKey) -> bool {
    find(key).is_none()
}

/// The key the other way's packets arrive with: what this entry makes of the packet, reversed.
#[inline(always)]
pub fn other_way(entry: &SvcCtEntry, protocol: u8, family: u8) -> FlowKey {
    FlowKey {
        family,
        protocol,
        pad: [0; 2],
        src_port: entry.dst_port,
        dst_port: entry.src_port,
        src_addr: entry.dst_addr,
        dst_addr: entry.src_addr,
    }
}

/// Notes a packet of a tracked flow: its time, and the state it moves the flow to. Any UDP reply
/// establishes; for TCP the backend's SYN-ACK, then the client's ACK; the backend's FIN or RST
/// closes (the client's comes from the LAN, where anyone can forge it). Both entries get a new
/// state, so both age by it.
///
/// The client's ClientIP affinity is recorded once per flow, by `established` (`lan_affinity`'s
/// `established` inlined, or `established_call`, a BPF function, whichever the caller's frame
/// has room for): for UDP when the backend's first reply establishes the flow; for TCP at the
/// backend's first segment after the client's ACK without RST, since our state machine reads
/// flags, not sequence numbers: a blind ACK from a forged source establishes the flow too, but
/// the backend answers it with a RST (an attack review's finding). The reply entry's `pad[0]`
/// says it was recorded.
#[inline(always)]
pub fn seen(key: &FlowKey, entry: &SvcCtEntry, tcp_flags: u8, established: fn(&FlowKey, &SvcCtEntry)) {
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    let state = next_state(entry, key.protocol, tcp_flags);
    let tcp = key.protocol == PROTO_TCP;
    // The entry to record the affinity by, by its place in the map, not a copy on this frame
    // (no room for one); one call site below, as `established` may be inlined.
    let mut record = None;
    if state != entry.state {
        let stored = set_state(key, state, now);
        set_state(&other_way(entry, key.protocol, key.family), state, now);
        if !tcp && state == SVC_CT_ESTABLISHED {
            record = stored;
        }
    } else {
        let confirms = tcp
            && state == SVC_CT_ESTABLISHED
            && entry.direction == SVC_CT_REPLY
            && tcp_flags & TCP_RST == 0
            && entry.pad[0] == RECORDED_NOT;
        let touch = now.wrapping_sub(entry.last_seen_ns) >= TOUCH_NS;
        if (confirms || touch)
            && let Some(e) = SVC_CT.get_ptr_mut(key)
        {
            // SAFETY: an LRU value, valid while this program runs.
            unsafe {
                if touch {
                    (*e).last_seen_ns = now;
                }
                if confirms {
                    (*e).pad[0] = RECORDED;
                    record = Some(e);
                }
            }
        }
    }
    if let Some(stored) = record {
        // SAFETY: an LRU value, valid while this program runs.
        established(key, unsafe { &*stored });
    }
}

/// `SvcCtEntry::pad[0]` of a TCP reply entry: whether the client's affinity was recorded.
const RECORDED_NOT: u8 = 0;
const RECORDED: u8 = 1;

#[inline(always)]
fn next_state(entry: &SvcCtEntry, protocol: u8, tcp_flags: u8) -> u8 {
    let tcp = protocol == PROTO_TCP;
    let from_backend = entry.direction == SVC_CT_REPLY;
    if !tcp {
        return if from_backend && entry.state == SVC_CT_NEW { SVC_CT_ESTABLISHED } else { entry.state };
    }
    if tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        return if from_backend { SVC_CT_CLOSING } else { entry.state };
    }
    let syn_ack = tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK;
    match entry.state {
        SVC_CT_NEW if from_backend && syn_ack => SVC_CT_SYN_ACKED,
        SVC_CT_SYN_ACKED if !from_backend && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_ACK => SVC_CT_ESTABLISHED,
        state => state,
    }
}

/// Moves the entry under `key` to `state`; returns where it is.
#[inline(always)]
fn set_state(key: &FlowKey, state: u8, now: u64) -> Option<*mut SvcCtEntry> {
    let e = SVC_CT.get_ptr_mut(key)?;
    // SAFETY: an LRU value, valid while this program runs.
    unsafe {
        (*e).state = state;
        (*e).last_seen_ns = now;
    }
    Some(e)
}

/// What a new flow's packets become: `src`/`dst` the client's side after translation.
pub struct Translation {
    pub src: ([u8; 16], u16),
    pub dst: ([u8; 16], u16),
}

/// Claims the reply entry of a new flow (`reply_key`: backend → the translated source), unless
/// a live flow holds that key. The claim is the reservation: two CPUs cannot both take it.
#[inline(always)]
pub fn claim_reply(reply_key: &FlowKey, frontend: ([u8; 16], u16), client: ([u8; 16], u16)) -> bool {
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    let entry = SvcCtEntry {
        src_addr: frontend.0,
        dst_addr: client.0,
        src_port: frontend.1,
        dst_port: client.1,
        direction: SVC_CT_REPLY,
        state: SVC_CT_NEW,
        pad: [0; 2],
        last_seen_ns: now,
    };
    if SVC_CT.insert(reply_key, &entry, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    // Taken: by an aged flow, which a new one may replace.
    free(reply_key) && SVC_CT.insert(reply_key, &entry, u64::from(BPF_ANY)).is_ok()
}

/// Writes the forward entry of a flow whose reply entry is claimed.
#[inline(always)]
pub fn open(key: &FlowKey, to: &Translation) -> Option<SvcCtEntry> {
    // SAFETY: a helper any program may call.
    let now = unsafe { bpf_ktime_get_ns() };
    let entry = SvcCtEntry {
        src_addr: to.src.0,
        dst_addr: to.dst.0,
        src_port: to.src.1,
        dst_port: to.dst.1,
        direction: SVC_CT_FORWARD,
        state: SVC_CT_NEW,
        pad: [0; 2],
        last_seen_ns: now,
    };
    SVC_CT.insert(key, &entry, u64::from(BPF_ANY)).ok()?;
    Some(entry)
}

/// Forgets a claimed reply entry whose forward entry could not be written.
#[inline(always)]
pub fn release(reply_key: &FlowKey) {
    let _ = SVC_CT.remove(reply_key);
}
