//! Events carry `bpf_ktime_get_ns` (CLOCK_MONOTONIC, which stops while the machine sleeps and
//! starts at boot): shown as wall-clock time through one reading of both clocks.
use std::time::{Duration, SystemTime};

use nix::time::{ClockId, clock_gettime};

pub struct WallClock {
    /// The wall clock and the monotonic clock, read back to back.
    wall_at: SystemTime,
    monotonic_at_ns: u64,
}

impl WallClock {
    pub fn now() -> Self {
        Self { wall_at: SystemTime::now(), monotonic_at_ns: monotonic_ns() }
    }

    /// The wall-clock time of a monotonic reading.
    pub fn wall(&self, monotonic: u64) -> SystemTime {
        if monotonic >= self.monotonic_at_ns {
            self.wall_at + Duration::from_nanos(monotonic - self.monotonic_at_ns)
        } else {
            self.wall_at - Duration::from_nanos(self.monotonic_at_ns - monotonic)
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds, as the programs' `bpf_ktime_get_ns` reads it.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux.
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_monotonic_reading_maps_to_the_wall_clock_at_the_same_distance() {
        let clock = WallClock { wall_at: SystemTime::UNIX_EPOCH + Duration::from_secs(100), monotonic_at_ns: 5_000 };
        assert_eq!(clock.wall(7_000), SystemTime::UNIX_EPOCH + Duration::from_nanos(100_000_002_000));
        assert_eq!(clock.wall(1_000), SystemTime::UNIX_EPOCH + Duration::from_nanos(99_999_996_000));
    }
}
