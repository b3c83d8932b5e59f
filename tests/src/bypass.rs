//! The attack on an egress limit kept in a pod's own qdisc: a packet socket with
//! `PACKET_QDISC_BYPASS` hands its frames straight to the interface's driver, past every qdisc of
//! the interface, and needs only `CAP_NET_RAW`, which a pod's processes have by default. What
//! a receiver then gets is measured on its interface's counters.
use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use crate::{run_in, traffic::in_netns};

/// What one flood did: bytes handed to the driver and how long it ran.
#[derive(Clone, Copy, Debug)]
pub struct Flood {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Flood {
    /// The rate the sender pushed, bits per second.
    pub fn bits_per_second(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64()
    }
}

/// Sends `frame` (a whole Ethernet frame) out of `ifname` inside `netns` again and again for
/// `duration`, as fast as the socket takes it, from a packet socket with `PACKET_QDISC_BYPASS`.
/// Frames the driver refuses (a full queue) are not counted.
pub fn flood(netns: &str, ifname: &str, frame: Vec<u8>, duration: Duration) -> Result<Flood> {
    let name = std::ffi::CString::new(ifname)?;
    in_netns(netns, move || {
        // SAFETY: plain syscalls; the descriptor is owned at once. Protocol 0: a socket that
        // only sends (it receives nothing).
        let fd = unsafe {
            let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            ensure!(raw >= 0, "packet socket: {}", std::io::Error::last_os_error());
            OwnedFd::from_raw_fd(raw)
        };
        let one: libc::c_int = 1;
        // SAFETY: `one` is a valid c_int for the call.
        let set = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&raw const one).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        ensure!(set == 0, "PACKET_QDISC_BYPASS: {}", std::io::Error::last_os_error());
        // SAFETY: `name` is a valid C string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
        ensure!(ifindex > 0, "no interface {name:?}");
        // SAFETY: plain data, zero is valid.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(frame.get(..6).context("frame shorter than a MAC")?);
        let started = Instant::now();
        let mut bytes = 0u64;
        while started.elapsed() < duration {
            for _ in 0..256 {
                // SAFETY: buffer and address are valid for the call.
                let sent = unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&raw const addr).cast(),
                        size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if sent > 0 {
                    bytes += sent as u64;
                }
            }
        }
        Ok(Flood { bytes, elapsed: started.elapsed() })
    })
}

/// Bytes the interface `ifname` of `netns` has received, from its counters.
pub fn rx_bytes(netns: &str, ifname: &str) -> Result<u64> {
    let out = run_in(netns, "ip", &["-j", "-s", "link", "show", "dev", ifname])?;
    let links: Value = serde_json::from_slice(&out.stdout).context("ip -j -s link")?;
    links[0]["stats64"]["rx"]["bytes"].as_u64().with_context(|| format!("no rx bytes for {ifname} in {netns}"))
}
