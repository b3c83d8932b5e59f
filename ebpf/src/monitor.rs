//! Events for `ebpf-cni monitor` (`MONITOR_EVENTS`, see `ebpf_common::MonitorEvent`): written only
//! while a monitor listens, at a bounded rate per CPU.
//!
//! Interface stub: the monitor's work fills these in; the policy code calls [`verdict`].
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, FlowKey};

/// A packet dropped for `reason` (called from `maps::drop`).
#[inline(always)]
#[allow(dead_code, reason = "interface stub, filled in by the monitor's work")]
pub fn drop(_ctx: &TcContext, _reason: DropReason) {}

/// A new flow's policy verdict: `kind` is `MONITOR_POLICY_ALLOWED` or `MONITOR_POLICY_DENIED`,
/// `direction` `MONITOR_INGRESS`/`MONITOR_EGRESS` as seen by the pod at `ctx`'s interface or the
/// pod the packet is delivered into (`ifindex`), `key` the packet's own 5-tuple.
#[inline(always)]
#[allow(dead_code, reason = "interface stub, filled in by the monitor's work")]
pub fn verdict(_ctx: &TcContext, _kind: u8, _direction: u8, _slot: u32, _ifindex: u32, _key: &FlowKey) {}
