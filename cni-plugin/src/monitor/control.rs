//! `MONITOR_CONTROL` and `MONITOR_BUDGET`: the monitor's side of "off when nobody listens".
//! The programs write events while `listening_until_ns` is ahead of their clock: renewed every
//! second to two seconds ahead, so that a monitor killed without a word (SIGKILL) turns them off
//! within two seconds; set to 0 on a normal exit, which turns them off at once and spares the
//! programs even the clock read.
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use aya::maps::{Array, MapData, PerCpuArray, PerCpuValues};
use ebpf_common::{MonitorBudget, MonitorControl, names};

use super::clock::monotonic_ns;
use crate::bpf::{Pins, read};

pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How far ahead each renewal reaches.
const HOLD: Duration = Duration::from_secs(2);

pub const NO_MONITOR: &str = "this network's datapath has no monitor (loaded by an older release)";

pub struct Control {
    slot: Array<MapData, MonitorControl>,
    budget: PerCpuArray<MapData, MonitorBudget>,
    rate: u32,
}

impl Control {
    pub fn open(pins: &Pins) -> Result<Self> {
        require_monitor(pins)?;
        Ok(Self {
            slot: Array::try_from(read::open_map(pins, names::MONITOR_CONTROL)?)?,
            budget: PerCpuArray::try_from(read::open_map(pins, names::MONITOR_BUDGET)?)?,
            rate: 0,
        })
    }

    /// One monitor per network: two would take each other's events from the one ring buffer.
    pub fn refuse_if_taken(&self) -> Result<()> {
        let current = self.slot.get(&0, 0).context("reading MONITOR_CONTROL")?;
        if current.listening_until_ns > monotonic_ns() {
            bail!("another monitor listens on this network (or one was killed less than {} s ago)", HOLD.as_secs());
        }
        Ok(())
    }

    /// Turns events on at `rate` per second per CPU, with the loss counts at zero.
    pub fn start(&mut self, rate: u32) -> Result<()> {
        self.reset_budget()?;
        self.rate = rate;
        self.renew()
    }

    pub fn renew(&mut self) -> Result<()> {
        let until = monotonic_ns() + HOLD.as_nanos() as u64;
        let control = MonitorControl { listening_until_ns: until, rate_per_sec: self.rate, pad: 0 };
        self.slot.set(0, control, 0).context("renewing MONITOR_CONTROL")
    }

    /// Turns events off; the events lost while on (over the rate or to a full buffer).
    pub fn stop(&mut self) -> Result<u64> {
        self.slot.set(0, MonitorControl::default(), 0).context("resetting MONITOR_CONTROL")?;
        let lost = self.budget.get(&0, 0).context("reading MONITOR_BUDGET")?.iter().map(|b| u64::from(b.lost)).sum();
        self.reset_budget()?;
        Ok(lost)
    }

    fn reset_budget(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        let zero = PerCpuValues::try_from(vec![MonitorBudget::default(); cpus])?;
        self.budget.set(0, zero, 0).context("resetting MONITOR_BUDGET")
    }
}

/// Pins of a release before the monitor (9ad4fe6, or the previous layout) lack its maps.
fn require_monitor(pins: &Pins) -> Result<()> {
    let path = pins.map(names::MONITOR_CONTROL);
    if !path.try_exists().with_context(|| format!("reading {} (run as root)", path.display()))? {
        bail!("{NO_MONITOR}; it gets one when it is loaded again, once the network's last pod is gone");
    }
    Ok(())
}
