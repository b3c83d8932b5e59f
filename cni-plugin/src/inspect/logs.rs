//! `inspect logs`: the TC programs' aya-log records, read from the ring buffer of the pinned
//! programs (all three share one) and printed one per line on stdout.
use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::programs::ProgramInfo;
use aya_log::EbpfLogger;
use ebpf_common::names;
use log::{Log, Metadata, Record};

use crate::bpf::Pins;

/// How often `--follow` polls the ring buffer.
const POLL: Duration = Duration::from_millis(200);

/// Set once stdout's reader has gone (`inspect logs -f | head`): following stops there.
static READER_GONE: AtomicBool = AtomicBool::new(false);

struct Stdout;

impl Log for Stdout {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        // Other write errors cannot be returned from here; the record is lost either way.
        if let Ok(false) = crate::cli::write_stdout(&format!("{:5} {}\n", record.level(), record.args())) {
            READER_GONE.store(true, Ordering::Relaxed);
        }
    }

    fn flush(&self) {}
}

pub fn read(pins: &Pins, follow: bool) -> Result<()> {
    let program = ProgramInfo::from_pin(pins.program(names::FROM_POD)).context("opening pinned from_pod")?;
    let mut logger = EbpfLogger::init_from_id_with_logger(program.id(), Stdout)
        .context("opening the programs' log buffer (AYA_LOGS)")?;
    loop {
        logger.flush();
        if !follow || READER_GONE.load(Ordering::Relaxed) {
            return Ok(());
        }
        sleep(POLL);
    }
}
