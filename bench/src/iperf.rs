//! iperf3 runs between two namespaces, read from iperf3's JSON report: TCP throughput and
//! retransmits (with the machine's CPU time spent meanwhile), UDP packets per second and loss.
use std::{thread::sleep, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{cpu, proc::Background, topology::Pair};

/// iperf3's default port, TCP (control and streams) and UDP (datagrams).
pub const PORT: u16 = 5201;

/// Where iperf3's client and server run. Both `None`: wherever the scheduler puts them.
#[derive(Clone, Copy)]
pub struct Placement {
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
}

/// Sender on CPU 0, receiver on CPU 1: the two sides never compete for a CPU.
pub const SPLIT: Placement = Placement { client_cpu: Some(0), server_cpu: Some(1) };
/// Wherever the scheduler puts them (several streams).
pub const FREE: Placement = Placement { client_cpu: None, server_cpu: None };

pub struct Tcp {
    pub gbits: f64,
    pub retransmits: u64,
    /// Busy CPU seconds of the whole machine per GB received.
    pub cpu_s_per_gb: f64,
}

pub struct Udp {
    /// Datagrams the server received per second.
    pub pps: f64,
    pub loss_percent: f64,
}

pub fn tcp(pair: &Pair, seconds: u32, streams: u32, at: Placement, reverse: bool) -> Result<Tcp> {
    let mut args = vec!["-P".to_string(), streams.to_string()];
    if reverse {
        args.push("-R".into());
    }
    cpu::wait_idle()?;
    let busy = cpu::busy_seconds()?;
    let report = run(pair, seconds, at, &args)?;
    let busy = cpu::busy_seconds()? - busy;
    let received = &report["end"]["sum_received"];
    let bits = received["bits_per_second"].as_f64().context("no sum_received")?;
    let bytes = received["bytes"].as_f64().context("no bytes received")?;
    ensure!(bytes > 0.0, "iperf3 moved no data");
    Ok(Tcp {
        gbits: bits / 1e9,
        retransmits: report["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        cpu_s_per_gb: busy / (bytes / 1e9),
    })
}

/// UDP at full speed (`-b 0`) with `size`-byte datagrams.
pub fn udp(pair: &Pair, seconds: u32, size: u32, at: Placement) -> Result<Udp> {
    let args = ["-u".to_string(), "-b".into(), "0".into(), "-l".into(), size.to_string()];
    cpu::wait_idle()?;
    let report = run(pair, seconds, at, &args)?;
    let sum = &report["end"]["sum"];
    let packets = sum["packets"].as_f64().context("no packets")?;
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let secs = sum["seconds"].as_f64().context("no seconds")?;
    ensure!(packets > lost, "no datagram arrived");
    Ok(Udp { pps: (packets - lost) / secs, loss_percent: sum["lost_percent"].as_f64().unwrap_or(0.0) })
}

fn run(pair: &Pair, seconds: u32, at: Placement, extra: &[String]) -> Result<Value> {
    let _server = Background::spawn_in(&pair.server_ns, at.server_cpu, "iperf3", &["-s", "-1", "-B", &pair.server_ip])?;
    // iperf3 -s listens within milliseconds; one retry covers a slow start.
    sleep(Duration::from_millis(200));
    let secs = seconds.to_string();
    let mut args: Vec<&str> = vec!["-c", &pair.dial_ip, "-t", &secs, "-J"];
    args.extend(extra.iter().map(String::as_str));
    let client = || crate::proc::output_confined(&pair.client_ns, pair.client_cgroup(), at.client_cpu, "iperf3", &args);
    let out = client().or_else(|_| {
        sleep(Duration::from_millis(500));
        client()
    })?;
    let report: Value = serde_json::from_str(&out).context("iperf3 -J output")?;
    if let Some(error) = report["error"].as_str() {
        bail!("iperf3 {} -> {}: {error}", pair.client_ns, pair.dial_ip);
    }
    Ok(report)
}
