//! The policy code's clock: `bpf_ktime_get_coarse_ns` (CLOCK_MONOTONIC at the tick's
//! resolution), read once per tick on each CPU. The coarse clock moves only when the tick moves
//! `jiffies`, and `bpf_jiffies64` is a load the verifier inlines, where the coarse clock is a
//! helper call: 7 ns of the 80 an established flow's packet pays for both checks. The value is
//! kept in the CPU's scratch value; it may lag the coarse clock by one tick (the tick moves
//! `jiffies` just before the clock), which ages of seconds do not notice.
//!
//! Never ahead of CLOCK_MONOTONIC, and never more than about two ticks behind it (8 ms at
//! HZ=250): a read is kept only for the tick `jiffies` named just after it, and `jiffies` does
//! not stand still while anything runs: an idle CPU (NO_HZ) whose tick stopped brings it up to
//! date as it wakes, before the packet's softirq. One exception, rare and short: the tick moves
//! `jiffies` before the clock, and after every CPU idled, by the whole idle; a read on another
//! CPU in that window (a microsecond) gets the clock from before the idle and keeps it for the
//! rest of the tick on that CPU: ages look younger by the idle (seconds at most) for one tick,
//! budgets are stricter. Entries written from another CPU's newer read are in this one's
//! future, which ages take as age 0 (`flows::live`).
use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};

use super::scratch::Scratch;

/// Now, in `bpf_ktime_get_coarse_ns`' nanoseconds.
#[inline(always)]
pub fn now(s: &mut Scratch) -> u64 {
    // SAFETY: plain helper call (inlined by the verifier).
    if unsafe { bpf_jiffies64() } != s.clock_tick || s.clock_ns == 0 {
        // The read before its tick, in that order: a run on this CPU between the two writes
        // would find the old tick and read the clock itself, never the new tick beside an old
        // read (hours old, for a CPU that ran no check since). No TC run comes between (a CPU
        // runs them one at a time, bottom halves off), but a test run (`BPF_PROG_TEST_RUN`,
        // preemptible) can be interrupted by one. The tick is read again after the clock
        // rather than kept across the helper call: a register less for the callers (spills).
        // SAFETY: plain helper calls; fields of this CPU's scratch value.
        unsafe {
            (&raw mut s.clock_ns).write_volatile(bpf_ktime_get_coarse_ns());
            (&raw mut s.clock_tick).write_volatile(bpf_jiffies64());
        }
    }
    s.clock_ns
}
