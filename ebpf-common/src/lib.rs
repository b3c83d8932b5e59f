//! Types shared by the TC programs (`ebpf/`) and the plugin (`cni-plugin/`).
//!
//! Every type here is `#[repr(C)]` and is the key or value of a pinned, BTF-typed map, so
//! `bpftool map dump pinned …` prints these field names. Changing a layout means bumping
//! [`PIN_LAYOUT_VERSION`], because pins of the old layout stay in bpffs across upgrades.
#![no_std]

mod drop_reason;
mod endpoint;

pub use drop_reason::DropReason;
pub use endpoint::{Counter, Endpoint, FAMILY_IPV4, FAMILY_IPV6, IpKey};

/// Version of the pinned map layout and program ABI; part of the pin path (`…/<network>/v<N>/`).
pub const PIN_LAYOUT_VERSION: u32 = 1;

/// Capacity of `ENDPOINTS`: one entry per pod address on the node. 64 Ki entries of
/// 20 + 32 bytes cost about 5 MiB of kernel memory, far above kubelet's default of 110 pods.
pub const ENDPOINTS_MAX_ENTRIES: u32 = 65_536;

/// Names of the programs and maps as they appear in the object and in bpffs.
pub mod names {
    pub const FROM_POD: &str = "from_pod";
    pub const ENDPOINTS: &str = "ENDPOINTS";
    pub const METRICS: &str = "METRICS";
}
