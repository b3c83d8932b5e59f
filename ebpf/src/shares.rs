//! The flows each pod holds through masquerade (`NAT_SHARES`, see ebpf-common's `shares.rs`):
//! counted up when a new flow gets a port (and down when it gets none after all). Flows that
//! end, idle out or lose their port to another flow are counted down by the agent's recount from
//! `NAT` (every interval) and GC's: between recounts a count only errs high. Plain
//! read-modify-writes, as in `pod_flows.rs`: two CPUs at once can lose a count, which the
//! recount puts right too.
//!
//! The two keys are built in a per-CPU scratch value (`SHARE_KEYS`), not on the stack: they
//! are needed where `to_uplink`'s frame already holds nearly all of the 512 bytes.
use aya_ebpf::bindings::BPF_NOEXIST;
use ebpf_common::{DatapathConfig, FlowKey, NAT_POD_MAX_FLOWS, Share, ShareKey, per_destination_bound};

use crate::maps;

/// Whether `owner`'s pod may hold one more flow towards the source of `reply` (and one more
/// in total); counts it if so.
#[inline(never)]
pub fn admit(owner: u64, reply: &FlowKey, config: &DatapathConfig) -> bool {
    let Some((total, towards)) = keys(owner, reply) else { return true };
    let bound = per_destination_bound(config.port_min, config.port_max);
    if held(total) >= NAT_POD_MAX_FLOWS || held(towards) >= bound {
        return false;
    }
    add(total, 1);
    add(towards, 1);
    true
}

/// `owner`'s flow towards the source of `reply` is gone (its port taken over, or never used).
#[inline(never)]
pub fn release(owner: u64, reply: &FlowKey) {
    if let Some((total, towards)) = keys(owner, reply) {
        add(total, -1);
        add(towards, -1);
    }
}

/// `owner`'s total key and its key towards the source of `reply`, in this CPU's scratch value.
#[inline(always)]
fn keys(owner: u64, reply: &FlowKey) -> Option<(*const ShareKey, *const ShareKey)> {
    let total = maps::SHARE_KEYS.get_ptr_mut(0)?;
    let towards = maps::SHARE_KEYS.get_ptr_mut(1)?;
    // SAFETY: per-CPU array slots, only this program run uses them.
    unsafe {
        // `ShareKey::total(owner)` word by word: the struct's assignment compiled to a call of
        // a byte-by-byte `memset` for its 24 zero bytes, a loop the verifier walked.
        let words = total.cast::<u64>();
        words.write_volatile(owner);
        for i in 1..size_of::<ShareKey>() / 8 {
            words.add(i).write_volatile(0);
        }
        (*towards).owner = owner;
        (*towards).family = reply.family;
        (*towards).protocol = reply.protocol;
        (*towards).dst_port = reply.src_port;
        (*towards).pad = 0;
        (*towards).dst_addr = reply.src_addr;
    }
    Some((total, towards))
}

#[inline(always)]
fn held(key: *const ShareKey) -> u32 {
    // SAFETY: `key` is a scratch slot filled by `keys`; the value is read at once.
    unsafe { maps::NAT_SHARES.get_ptr(&*key).map_or(0, |share| (*share).held) }
}

#[inline(always)]
fn add(key: *const ShareKey, delta: i32) {
    // SAFETY: as in `held`; an LRU value is valid while this program runs.
    unsafe {
        match maps::NAT_SHARES.get_ptr_mut(&*key) {
            Some(share) => (*share).held = (*share).held.saturating_add_signed(delta),
            None if delta > 0 => {
                let _ = maps::NAT_SHARES.insert(&*key, &Share { held: 1, pad: 0 }, u64::from(BPF_NOEXIST));
            }
            None => {}
        }
    }
}
