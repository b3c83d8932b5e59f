//! Machine-wide busy CPU time from /proc/stat: what sender, receiver and every softirq between
//! them burned, wherever the kernel ran it (process context or ksoftirqd).
use anyhow::{Context, Result};

/// /proc/stat counts in USER_HZ, which is 100 on Linux whatever the kernel's HZ.
const USER_HZ: f64 = 100.0;

/// Busy seconds (user, nice, system, irq, softirq) summed over all CPUs since boot.
pub fn busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().find(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    anyhow::ensure!(ticks.len() >= 7, "short cpu line in /proc/stat");
    // user nice system idle iowait irq softirq: idle and iowait are not work.
    let busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6];
    Ok(busy as f64 / USER_HZ)
}

/// Waits until the machine is quiet: less than 5% of it busy over a quarter second. Namespaces
/// deleted by the previous measurement are torn down by the kernel in the background (seconds
/// of work for a node with pods), and a run started meanwhile would share the CPUs with that.
/// Gives up after 30 s and says so.
pub fn wait_idle() -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let window = std::time::Duration::from_millis(250);
    let started = std::time::Instant::now();
    loop {
        let before = busy_seconds()?;
        std::thread::sleep(window);
        let busy = (busy_seconds()? - before) / (window.as_secs_f64() * cpus);
        if busy < 0.05 {
            return Ok(());
        }
        if started.elapsed().as_secs() > 30 {
            eprintln!("the machine stayed {:.0}% busy for 30 s; measuring anyway", busy * 100.0);
            return Ok(());
        }
    }
}
