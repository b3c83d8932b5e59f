//! The ring buffer and the signals that end the stream, waited on together with poll(2): the
//! kernel wakes the reader when the programs submit an event, so an idle monitor costs nothing
//! but its renewal once a second.
use std::{
    os::fd::{AsRawFd as _, RawFd},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{MapData, RingBuf};
use ebpf_common::{MonitorEvent, names};
use nix::sys::{
    signal::{SigSet, Signal},
    signalfd::{SfdFlags, SignalFd},
};

use super::event;
use crate::bpf::{Pins, read};

/// SIGINT and SIGTERM, blocked and read from a signalfd, so that the monitor resets the
/// control slot before it exits.
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    pub fn block() -> Result<Self> {
        let set = SigSet::from_iter([Signal::SIGINT, Signal::SIGTERM]);
        set.thread_block().context("blocking SIGINT and SIGTERM")?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("signalfd")?;
        Ok(Self { fd })
    }
}

pub struct Ring {
    ring: RingBuf<MapData>,
}

impl Ring {
    pub fn open(pins: &Pins) -> Result<Self> {
        let map = read::open_map(pins, names::MONITOR_EVENTS)?;
        Ok(Self { ring: RingBuf::try_from(map).context("MONITOR_EVENTS is not a ring buffer")? })
    }

    /// The next event written, if any. Records of another size (another build) are skipped.
    pub fn next(&mut self) -> Option<MonitorEvent> {
        loop {
            let item = self.ring.next()?;
            if let Some(event) = event::parse(&item) {
                return Some(event);
            }
        }
    }

    /// Events left by an earlier monitor (written after it stopped reading): not this run's.
    pub fn discard_pending(&mut self) {
        while self.ring.next().is_some() {}
    }

    fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Woken {
    /// An event may be there, or the time came.
    Ready,
    Signal,
}

/// Waits for an event, a signal or `until`, whichever first.
pub fn wait(ring: &Ring, signals: &Signals, until: Instant) -> Result<Woken> {
    let timeout = until.saturating_duration_since(Instant::now());
    let mut fds = [
        libc::pollfd { fd: ring.fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: signals.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    // Rounded up, so that a wait for a moment does not spin at zero.
    let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if ready < 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() == std::io::ErrorKind::Interrupted {
            return Ok(Woken::Ready);
        }
        bail!("poll: {error}");
    }
    if fds[1].revents != 0 && signals.fd.read_signal().context("reading the signalfd")?.is_some() {
        return Ok(Woken::Signal);
    }
    Ok(Woken::Ready)
}
