//! The pod that sent a packet into `from_pod`, found by the host veth it arrived on, and the
//! anti-spoofing check: the source must be an address of that pod. First the veth's slot in
//! `HOST_VETHS` (an array slot: no hash of a 20-byte key, no helper call once the verifier has
//! inlined it); when the slot holds another veth or another address, `ENDPOINTS` by the
//! source address, as before, and only that lookup says "spoofed" (`None`).
use aya_ebpf::programs::TcContext;
use ebpf_common::{Endpoint, HostVeth, IpKey, host_veth_slot};

use crate::{maps, packet};

/// What `from_pod` needs of the sending pod.
#[derive(Clone, Copy)]
pub struct Sender {
    pub owner: u64,
    /// `Endpoint::flags` of the source address's entry.
    pub flags: u32,
    pub stack_epoch: u32,
}

impl Sender {
    #[inline(always)]
    fn of_slot(slot: &HostVeth) -> Self {
        Self { owner: slot.owner, flags: slot.flags, stack_epoch: slot.stack_epoch }
    }

    /// # Safety
    /// `pod` points at an `ENDPOINTS` value, valid while the program runs.
    #[inline(always)]
    pub unsafe fn of_endpoint(pod: *const Endpoint) -> Self {
        // SAFETY: by the caller.
        unsafe { Self { owner: (*pod).owner, flags: (*pod).flags, stack_epoch: (*pod).stack_epoch } }
    }
}

/// The host veth's slot, if it holds that veth.
#[inline(always)]
fn slot(ifindex: u32) -> Option<&'static HostVeth> {
    maps::HOST_VETHS.get(host_veth_slot(ifindex)).filter(|slot| slot.ifindex == ifindex)
}

/// The sender of an IPv4 packet from `src`, or `None`: a spoofed source.
#[inline(always)]
pub fn v4(ctx: &TcContext, src: [u8; 4]) -> Option<Sender> {
    let ifindex = packet::ingress_ifindex(ctx);
    // The unspecified address is in no slot (a zero address means none there).
    if let Some(slot) = slot(ifindex)
        && u32::from_ne_bytes(slot.ipv4) == u32::from_ne_bytes(src)
        && src != [0; 4]
    {
        return Some(Sender::of_slot(slot));
    }
    own_endpoint(ifindex, &IpKey::v4(src))
}

/// The sender of an IPv6 packet from `src` (not `::`, which the caller handles), or `None`.
#[inline(always)]
pub fn v6(ctx: &TcContext, src: &[u8; 16]) -> Option<Sender> {
    let ifindex = packet::ingress_ifindex(ctx);
    if let Some(slot) = slot(ifindex)
        && same16(&slot.ipv6, src)
    {
        return Some(Sender::of_slot(slot));
    }
    own_endpoint(ifindex, &IpKey::v6_words(*src))
}

/// `ENDPOINTS`' entry for `key`, if it is the pod's behind `ifindex`.
#[inline(always)]
pub fn endpoint_of(ifindex: u32, key: &IpKey) -> Option<*const Endpoint> {
    let pod = maps::ENDPOINTS.get_ptr(key)?;
    // SAFETY: a hash map value, valid while this program runs.
    (unsafe { (*pod).host_ifindex } == ifindex).then_some(pod)
}

#[inline(always)]
fn own_endpoint(ifindex: u32, key: &IpKey) -> Option<Sender> {
    // SAFETY: an `ENDPOINTS` value.
    endpoint_of(ifindex, key).map(|pod| unsafe { Sender::of_endpoint(pod) })
}

/// Two addresses compared four bytes at a time.
#[inline(always)]
fn same16(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let word = |x: &[u8; 16], i: usize| u32::from_ne_bytes([x[i], x[i + 1], x[i + 2], x[i + 3]]);
    (word(a, 0) ^ word(b, 0)) | (word(a, 4) ^ word(b, 4)) | (word(a, 8) ^ word(b, 8)) | (word(a, 12) ^ word(b, 12)) == 0
}
