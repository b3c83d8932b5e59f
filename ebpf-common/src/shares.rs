//! How many masqueraded flows each pod holds (`NAT_SHARES`): in total, and towards each
//! destination (address, port, protocol: one destination's replies share one range of node
//! ports). A pod at either bound opens no new flow there (`NatPodShare`), so that one pod can
//! neither take a destination's ports from the others nor fill `NAT`, whose LRU would then
//! evict the others' idle but live flows.
//!
//! Held, not opened per minute: a flow counts from its first packet until the pod closes it
//! (FIN or RST), it idles out, or its pod is gone, whether or not it carries traffic. The
//! programs count up when they hand out a port and down when the pod closes a flow; the node
//! agent recounts from `NAT`'s live reply entries every interval (and GC does), which forgets
//! flows that idled out, lost their port to another flow or were dropped by the LRU. Between
//! recounts a count only errs high: a pod at its bound waits for the next recount.

/// A pod's count: towards one destination, or (all of `protocol`, `dst_port` and `dst_addr`
/// zero, `family` 0) in total.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShareKey {
    /// The attachment that owns the flows (`Endpoint::owner`).
    pub owner: u64,
    pub family: u8,
    pub protocol: u8,
    pub dst_port: u16,
    pub pad: u32,
    pub dst_addr: [u8; 16],
}

impl ShareKey {
    /// The key of `owner`'s total.
    pub const fn total(owner: u64) -> Self {
        Self { owner, family: 0, protocol: 0, dst_port: 0, pad: 0, dst_addr: [0; 16] }
    }
}

/// Flows held (value of `NAT_SHARES`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Share {
    pub held: u32,
    pub pad: u32,
}

/// Masqueraded flows one pod may hold at once, all destinations together: half of what `NAT`
/// holds (two entries a flow), so that one pod cannot fill it and have its LRU evict the others'
/// idle flows. Half, not less: a DNS forwarder (CoreDNS to its upstream) holds a flow per query
/// for UDP's 60 s, some thousands at a few hundred queries a second.
pub const NAT_POD_MAX_FLOWS: u32 = crate::NAT_MAX_ENTRIES / 2 / 2;

/// Ports one pod may hold towards one destination: half of the masquerade range (at least 64),
/// so that the other pods always find the other half there.
pub const fn per_destination_bound(port_min: u16, port_max: u16) -> u32 {
    let span = port_max.saturating_sub(port_min) as u32 + 1;
    let bound = span / 2;
    if bound < 64 { 64 } else { bound }
}

/// Capacity of `NAT_SHARES`: a pod's total and one entry per destination it holds flows to.
/// LRU: an entry pushed out starts again from zero, which only makes a bound lenient until the
/// agent's next recount. 32 + 8 bytes each.
pub const NAT_SHARES_MAX_ENTRIES: u32 = crate::NAT_MAX_ENTRIES;
