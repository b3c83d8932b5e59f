//! Request/response latency: sockperf ping-pong, full round trips, client and server pinned to
//! the same CPU (design.md: across CPUs this VM adds ~50 µs of wake-up latency that would hide
//! any difference between paths).
use std::{thread::sleep, time::Duration};

use anyhow::{Context, Result};

use crate::{proc::Background, topology::Pair};

/// Where sockperf listens (a Service in front of it forwards this port).
pub const PORT: u16 = 11111;

/// The CPU client and server of every latency run share.
pub const LATENCY_CPU: usize = 1;

#[derive(Clone, Copy)]
pub enum Protocol {
    Tcp,
    Udp,
}

pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
}

pub fn ping_pong(pair: &Pair, protocol: Protocol, seconds: u32, cpu: usize) -> Result<Latency> {
    let tcp: &[&str] = match protocol {
        Protocol::Tcp => &["--tcp"],
        Protocol::Udp => &[],
    };
    crate::cpu::wait_idle()?;
    let port = PORT.to_string();
    let mut server = vec!["sr", "-i", &pair.server_ip, "-p", &port];
    server.extend(tcp);
    let _server = Background::spawn_in(&pair.server_ns, Some(cpu), "sockperf", &server)?;
    sleep(Duration::from_millis(300));
    let secs = seconds.to_string();
    let mut client = vec!["pp", "-i", &pair.dial_ip, "-p", &port, "-t", &secs, "--full-rtt"];
    client.extend(tcp);
    let out = crate::proc::output_confined(&pair.client_ns, pair.client_cgroup(), Some(cpu), "sockperf", &client)?;
    Ok(Latency { p50_us: percentile(&out, "50.000")?, p99_us: percentile(&out, "99.000")? })
}

/// The value of sockperf's "---> percentile 99.000 =   22.719" line.
fn percentile(out: &str, which: &str) -> Result<f64> {
    let tag = format!("percentile {which} =");
    out.lines()
        .find_map(|l| l.split_once(&tag).and_then(|(_, v)| v.trim().parse().ok()))
        .with_context(|| format!("sockperf printed no {tag}: {out}"))
}
