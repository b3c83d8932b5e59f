//! The policy code's clock: `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC at the tick's
//! resolution), read once per tick on each CPU. The coarse clock moves only when the tick moves
//! `jiffies`, and `bpf_jiffies64` is a load the verifier inlines, where the coarse clock is a
//! helper call: 7 ns of the 80 an established flow's packet pays for both checks. The value is
//! kept in the CPU's scratch value; it may lag the coarse clock by one tick (the tick moves
//! `jiffies` just before the clock), which ages of seconds do not notice.
use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};

use super::scratch::Scratch;

/// Now, in `bpf_ktime_get_coarse_ns`' nanoseconds.
#[inline(always)]
pub fn now(s: &mut Scratch) -> u64 {
    // SAFETY: plain helper call (inlined by the verifier).
    let tick = unsafe { bpf_jiffies64() };
    if tick != s.clock_tick || s.clock_ns == 0 {
        s.clock_tick = tick;
        // SAFETY: plain helper call.
        s.clock_ns = unsafe { bpf_ktime_get_coarse_ns() };
    }
    s.clock_ns
}
