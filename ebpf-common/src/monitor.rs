//! `ebpf-cni monitor`: what the programs tell a listener through the `MONITOR_EVENTS` ring
//! buffer. Nothing is written unless a monitor listens (`MONITOR_CONTROL`), and then at most
//! `rate_per_sec` events per CPU, so that a flood costs the datapath a compare and a counter.

/// [`MonitorEvent::kind`]: a packet dropped, `reason` says why (a `DropReason`).
pub const MONITOR_DROP: u8 = 1;
/// A new flow a policy allowed (`policy_slot`: which).
pub const MONITOR_POLICY_ALLOWED: u8 = 2;
/// A new flow no policy allowed: also a `MONITOR_DROP` with reason `PolicyDenied`, sent once as
/// this kind.
pub const MONITOR_POLICY_DENIED: u8 = 3;

/// [`MonitorEvent::direction`]: the verdict was on the way into the pod at `ifindex`.
pub const MONITOR_INGRESS: u8 = 0;
/// Out of the pod at `ifindex`.
pub const MONITOR_EGRESS: u8 = 1;
/// Not a policy verdict (a drop elsewhere).
pub const MONITOR_NO_DIRECTION: u8 = 2;

/// One record of `MONITOR_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorEvent {
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub time_ns: u64,
    /// `MONITOR_*` kind.
    pub kind: u8,
    /// 4 or 6; 0 when the packet was not IP (an ARP or malformed frame).
    pub family: u8,
    /// IP protocol number.
    pub protocol: u8,
    /// `MONITOR_INGRESS`, `MONITOR_EGRESS` or `MONITOR_NO_DIRECTION`.
    pub direction: u8,
    /// `DropReason` number for drops, 0 otherwise.
    pub reason: u32,
    /// `POLICY_COUNTS` slot of the policy (0: none).
    pub policy_slot: u32,
    /// The interface whose program decided (a pod's host veth, the uplink).
    pub ifindex: u32,
    /// Host byte order; 0 when the protocol has none.
    pub src_port: u16,
    pub dst_port: u16,
    /// Length of the packet.
    pub len: u32,
    /// IPv4 in the first 4 bytes.
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

/// Slot 0 of `MONITOR_CONTROL`, written by the monitor while it runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorControl {
    /// Events are written while `bpf_ktime_get_ns() < listening_until_ns`: the monitor renews it
    /// every second, so a monitor killed without a word turns events off within seconds.
    pub listening_until_ns: u64,
    /// Events per second per CPU, at most.
    pub rate_per_sec: u32,
    pub pad: u32,
}

/// Per-CPU token bucket of the rate limit (`MONITOR_BUDGET`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorBudget {
    /// When the current second began.
    pub window_start_ns: u64,
    /// Events written in it.
    pub sent: u32,
    /// Events not written for the limit or a full buffer since the monitor started.
    pub lost: u32,
}

/// Size of `MONITOR_EVENTS` in bytes (a power of two pages): 4,096 events of 72 bytes.
pub const MONITOR_EVENTS_BYTES: u32 = 256 * 1024;
/// The monitor's default rate per CPU.
pub const MONITOR_DEFAULT_RATE: u32 = 1_000;
