//! `ebpf-cni monitor`: a live stream of the datapath's drops and policy verdicts, read from the
//! network's `MONITOR_EVENTS` ring buffer. The programs write events only while a monitor renews
//! `MONITOR_CONTROL` (`control.rs`), at most `--rate` per second per CPU; this prints them, named
//! (`naming.rs`), filtered (`filter.rs`), as a table or JSON lines (`output.rs`).
mod args;
mod clock;
mod control;
mod event;
mod filter;
mod naming;
mod output;
mod reader;

use std::time::Instant;

use anyhow::Result;

pub use args::Monitor;

use crate::bpf::read;

pub fn run(args: Monitor) -> Result<()> {
    let pins = read::pinned(&args.bpffs_root, &args.network)?;
    // Blocked before anything else, so that SIGINT and SIGTERM reach the reader's signalfd
    // and the control slot is always reset on the way out.
    let signals = reader::Signals::block()?;
    // The control first: it tells a datapath without the monitor's maps apart.
    let mut control = control::Control::open(&pins)?;
    let mut ring = reader::Ring::open(&pins)?;
    control.refuse_if_taken()?;
    ring.discard_pending();
    control.start(args.rate)?;
    let outcome = stream(&args, &pins, &mut ring, &mut control, &signals);
    let stopped = control.stop();
    let lost = stopped.as_ref().map_or(0, |lost| *lost);
    if lost > 0 || args.count.is_none() {
        eprintln!("ebpf-cni monitor: {lost} events lost (over --rate, or the ring buffer was full)");
    }
    outcome.and(stopped.map(drop))
}

/// Reads and prints events until a signal, `--count` or `--duration`, renewing the control slot
/// every second meanwhile.
fn stream(
    args: &Monitor,
    pins: &crate::bpf::Pins,
    ring: &mut reader::Ring,
    control: &mut control::Control,
    signals: &reader::Signals,
) -> Result<()> {
    let filter = filter::Filter::new(args);
    let mut names = naming::Names::new(pins.clone(), args.policy_names.clone());
    let mut out = output::Output::new(args.output);
    let clock = clock::WallClock::now();
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut printed = 0u64;
    let mut next_renewal = Instant::now() + control::RENEW_EVERY;
    loop {
        let mut wake = next_renewal;
        if let Some(deadline) = deadline {
            wake = wake.min(deadline);
        }
        if reader::wait(ring, signals, wake)? == reader::Woken::Signal {
            return Ok(());
        }
        while let Some(event) = ring.next() {
            let record = names.describe(&event, &clock);
            if !filter.accepts(&record) {
                continue;
            }
            if !out.write(&record)? {
                return Ok(()); // stdout's reader has gone
            }
            printed += 1;
            if args.count.is_some_and(|count| printed >= count) {
                return Ok(());
            }
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Ok(());
        }
        if now >= next_renewal {
            control.renew()?;
            next_renewal = now + control::RENEW_EVERY;
        }
    }
}
