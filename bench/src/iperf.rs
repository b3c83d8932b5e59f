//! One iperf3 TCP run between two namespaces, each side pinned to a CPU (`-A`), read from
//! iperf3's JSON report.
use std::{
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use ebpf_cni_tests::run_in;
use serde_json::Value;

pub struct Placement {
    pub client_cpu: usize,
    pub server_cpu: usize,
}

pub struct Report {
    pub gbits: f64,
    pub retransmits: u64,
}

/// The iperf3 server, killed by its PID if it is still running when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which way the data flows on the client's connection.
#[derive(Clone, Copy)]
pub enum Direction {
    /// Client → server.
    Upload,
    /// Server → client (`iperf3 -R`), on the connection the client opened.
    Download,
}

impl Direction {
    pub const BOTH: [Self; 2] = [Self::Upload, Self::Download];
}

pub fn run(
    server_ns: &str,
    server_ip: &str,
    client_ns: &str,
    seconds: u32,
    at: &Placement,
    direction: Direction,
) -> Result<Report> {
    let server_cpu = at.server_cpu.to_string();
    let server = Server(
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{server_ns}"))
            .args(["iperf3", "-s", "-1", "-B", server_ip, "-A", &server_cpu])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?,
    );
    // iperf3 -s binds within milliseconds; the client retries once if it was not yet there.
    sleep(Duration::from_millis(200));
    let (secs, cpu) = (seconds.to_string(), at.client_cpu.to_string());
    let mut args = vec!["-c", server_ip, "-t", &secs, "-A", &cpu, "-J"];
    if matches!(direction, Direction::Download) {
        args.push("-R");
    }
    let out = run_in(client_ns, "iperf3", &args).or_else(|_| {
        sleep(Duration::from_millis(500));
        run_in(client_ns, "iperf3", &args)
    })?;
    let report: Value = serde_json::from_slice(&out.stdout).context("iperf3 -J output")?;
    if let Some(error) = report["error"].as_str() {
        bail!("iperf3 {client_ns} -> {server_ip}: {error}");
    }
    drop(server);
    let sent = &report["end"]["sum_sent"];
    let received = report["end"]["sum_received"]["bits_per_second"].as_f64().context("no sum_received")?;
    ensure!(received > 0.0, "iperf3 moved no data");
    Ok(Report { gbits: received / 1e9, retransmits: sent["retransmits"].as_u64().unwrap_or(0) })
}
