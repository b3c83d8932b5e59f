//! Bounds-checked access to packet headers (the verifier requires the check before each use).
use aya_ebpf::{bindings::TC_ACT_UNSPEC, programs::TcContext};

/// The verdict for a packet we leave alone: TCX runs the next program attached to the
/// interface, then any classic tc filter (the `bandwidth` plugin's, an operator's), then the
/// stack. `TC_ACT_OK` would skip them all.
pub const PASS: i32 = TC_ACT_UNSPEC;

/// A pointer to a `T` at `offset` in the linear packet data, or `None` if the packet is shorter.
#[inline(always)]
pub fn header_mut<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Index of the interface the packet arrived on.
#[inline(always)]
pub fn ingress_ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Whether the frame came with an 802.1Q tag. The receive path moves a tag out of the frame
/// into the skb's metadata before TC runs, so the ethertype alone does not show it.
#[inline(always)]
pub fn vlan_tagged(ctx: &TcContext) -> bool {
    // SAFETY: `skb` is the context pointer the kernel passed in.
    unsafe { (*ctx.skb.skb).vlan_present != 0 }
}
