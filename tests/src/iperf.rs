//! iperf3 between namespaces, for tests that check a rate (bandwidth limits): a one-shot server
//! that is killed by its PID when dropped, and a TCP client that reports what was received.
use std::{
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::run_in;

/// An `iperf3 -s -1` in a namespace, listening on one address and port.
pub struct Server(Child);

impl Server {
    pub fn start(netns: &str, ip: &str, port: u16) -> Result<Self> {
        // nsenter execs iperf3 in place: the PID is iperf3's.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["iperf3", "-s", "-1", "-B", ip, "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?;
        // It listens within milliseconds; the client below retries once anyway.
        sleep(Duration::from_millis(200));
        Ok(Self(child))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One TCP stream for `seconds` (after a first second left out, slow start and the bucket's
/// burst with it) from `client_ns` to a [`Server`] at `ip:port`; with `reverse` the server
/// sends. Returns the bits per second the receiving side got.
pub fn tcp_rate(client_ns: &str, ip: &str, port: u16, seconds: u32, reverse: bool) -> Result<f64> {
    let (port, secs) = (port.to_string(), seconds.to_string());
    let mut args = vec!["-c", ip, "-p", &port, "-t", &secs, "-O", "1", "-J"];
    if reverse {
        args.push("-R");
    }
    let run = || run_in(client_ns, "iperf3", &args);
    let out = run().or_else(|_| {
        sleep(Duration::from_millis(500));
        run()
    })?;
    let report: Value = serde_json::from_slice(&out.stdout).context("iperf3 -J output")?;
    if let Some(error) = report["error"].as_str() {
        bail!("iperf3 {client_ns} -> {ip}: {error}");
    }
    report["end"]["sum_received"]["bits_per_second"].as_f64().context("no sum_received in iperf3's report")
}
