//! Memory over a long run: the plugin's peak RSS per verb (wait4's `ru_maxrss`, in
//! [`crate::CniOutput`]) and the agent's resident set, sampled from /proc as it runs. A leak
//! shows as the last cycles' figures above the first ones'.
use anyhow::{Context, Result};

/// `VmRSS` of a running process, KiB.
pub fn resident_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("process {pid}"))?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).context("no VmRSS line")?;
    line.trim().trim_end_matches("kB").trim().parse().context("VmRSS is not a number")
}

/// Samples taken at a cycle number, KiB.
#[derive(Clone, Debug, Default)]
pub struct Series(pub Vec<(usize, u64)>);

/// Median and highest of some samples, KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub median: u64,
    pub max: u64,
    pub samples: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "median {} KiB, max {} KiB ({} samples)", self.median, self.max, self.samples)
    }
}

impl Series {
    pub fn push(&mut self, cycle: usize, kib: u64) {
        self.0.push((cycle, kib));
    }

    /// Samples of the first `cycles` cycles.
    pub fn first(&self, cycles: usize) -> Summary {
        summarize(self.0.iter().filter(|(c, _)| *c < cycles).map(|(_, k)| *k))
    }

    /// The samples nearest the start, the quarters and the end: a leak grows steadily, an
    /// allocator settling does not.
    pub fn quarters(&self) -> Vec<u64> {
        let n = self.0.len();
        if n == 0 {
            return Vec::new();
        }
        (0..=4).map(|q| self.0[(n - 1) * q / 4].1).collect()
    }

    /// Samples of the last `cycles` cycles.
    pub fn last(&self, cycles: usize) -> Summary {
        let end = self.0.iter().map(|(c, _)| c + 1).max().unwrap_or(0);
        summarize(self.0.iter().filter(|(c, _)| *c + cycles >= end).map(|(_, k)| *k))
    }
}

fn summarize(values: impl Iterator<Item = u64>) -> Summary {
    let mut values: Vec<u64> = values.collect();
    values.sort_unstable();
    Summary {
        median: values.get(values.len() / 2).copied().unwrap_or(0),
        max: values.last().copied().unwrap_or(0),
        samples: values.len(),
    }
}
