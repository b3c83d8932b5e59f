//! `ebpf-cni monitor` run against a testbed's network, and its maps read from the pins:
//! whether the programs see a listener, what they counted, what the ring buffer holds.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Command, ExitStatus, Stdio},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use ebpf_common::{MonitorBudget, MonitorControl, names};
use serde_json::Value;

use crate::Testbed;

/// A monitor running in the background; its stdout read line by line as it comes (a pipe
/// left unread would stop it once full).
pub struct MonitorRun {
    child: Child,
    lines: Option<JoinHandle<Vec<String>>>,
}

pub struct Finished {
    pub status: ExitStatus,
    pub lines: Vec<String>,
    pub stderr: String,
}

impl Finished {
    /// Each line of stdout as JSON (for `-o json`).
    pub fn events(&self) -> Vec<Value> {
        self.lines.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
    }

    /// The count the monitor reports on exit ("N events lost …").
    pub fn lost(&self) -> Option<u64> {
        let line = self.stderr.lines().find(|l| l.contains("events lost"))?;
        line.split_whitespace().find_map(|word| word.parse().ok())
    }
}

impl MonitorRun {
    /// Starts `ebpf-cni monitor` on the testbed's network with `args`, and waits until the
    /// programs see it listening (a time ahead of now in the control slot: one that a killed
    /// monitor left there has passed).
    pub fn start(tb: &Testbed, args: &[&str]) -> Result<Self> {
        let mut child = command(tb, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        let lines = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect());
        let mut run = Self { child, lines: Some(lines) };
        let started = Instant::now();
        while control(tb)?.listening_until_ns <= monotonic_ns() {
            if let Some(status) = run.child.try_wait()? {
                let finished = run.finish(Duration::ZERO)?;
                bail!("the monitor exited ({status}) before listening: {}", finished.stderr);
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("the monitor did not listen within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(run)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` to the monitor (by its PID).
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        Ok(nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)?)
    }

    /// Waits up to `timeout` for the monitor to exit (killed past it) and collects its output.
    pub fn finish(mut self, timeout: Duration) -> Result<Finished> {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                bail!("the monitor did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let lines = self.lines.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            pipe.read_to_string(&mut stderr)?;
        }
        Ok(Finished { status, lines, stderr })
    }
}

impl Drop for MonitorRun {
    fn drop(&mut self) {
        // A test that failed midway: the monitor must not outlive it.
        if self.lines.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `ebpf-cni monitor --network … --bpffs-root …` plus `args`, not started.
pub fn command(tb: &Testbed, args: &[&str]) -> Command {
    let mut command = Command::new(&tb.plugin.binary);
    command.arg("monitor").arg("--network").arg(&tb.network).arg("--bpffs-root").arg(tb.bpffs_root()).args(args);
    command
}

/// CLOCK_MONOTONIC, the programs' clock, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

fn open(tb: &Testbed, name: &str) -> Result<Map> {
    let pin = tb.map_pin(name);
    let data = MapData::from_pin(&pin).with_context(|| format!("opening {}", pin.display()))?;
    Ok(Map::from_map_data(data)?)
}

/// `MONITOR_CONTROL`'s slot as the programs read it.
pub fn control(tb: &Testbed) -> Result<MonitorControl> {
    let array: Array<_, MonitorControl> = Array::try_from(open(tb, names::MONITOR_CONTROL)?)?;
    Ok(array.get(&0, 0)?)
}

/// `MONITOR_BUDGET`, summed over CPUs: (events sent, events lost).
pub fn budget(tb: &Testbed) -> Result<(u64, u64)> {
    let array: PerCpuArray<_, MonitorBudget> = PerCpuArray::try_from(open(tb, names::MONITOR_BUDGET)?)?;
    let per_cpu = array.get(&0, 0)?;
    Ok((per_cpu.iter().map(|b| u64::from(b.sent)).sum(), per_cpu.iter().map(|b| u64::from(b.lost)).sum()))
}

/// Takes every record out of `MONITOR_EVENTS` (no monitor may run meanwhile): how many.
pub fn drain_events(tb: &Testbed) -> Result<usize> {
    let mut ring = RingBuf::try_from(open(tb, names::MONITOR_EVENTS)?)?;
    let mut count = 0;
    while ring.next().is_some() {
        count += 1;
    }
    Ok(count)
}

/// Writes `MONITOR_CONTROL`'s slot as a monitor would (tests that run the programs without one).
pub fn set_control(tb: &Testbed, control: MonitorControl) -> Result<()> {
    let mut array: Array<_, MonitorControl> = Array::try_from(open(tb, names::MONITOR_CONTROL)?)?;
    Ok(array.set(0, control, 0)?)
}
