//! Request/response latency over IPv6: qperf's `tcp_lat` and `udp_lat` (Debian's sockperf 3.7
//! takes no IPv6 address). qperf reports the mean one-way latency of 1-byte ping-pongs, half a
//! round trip; the figure is the whole round trip, as sockperf's are. Client and server share
//! one CPU, as in the sockperf runs (design.md: cross-CPU wake-ups would hide the paths).
use std::{thread::sleep, time::Duration};

use anyhow::{Context, Result, bail};

use crate::{proc::Background, sockperf::Protocol, topology::Pair};

/// qperf's control port (its data connections take ports of their own).
const PORT: u16 = 19765;

/// The mean round trip, µs.
pub fn mean_rtt(pair: &Pair, protocol: Protocol, seconds: u32, cpu: usize) -> Result<f64> {
    let test = match protocol {
        Protocol::Tcp => "tcp_lat",
        Protocol::Udp => "udp_lat",
    };
    crate::cpu::wait_idle()?;
    let port = PORT.to_string();
    let _server = Background::spawn_in(&pair.server_ns, Some(cpu), "qperf", &["-lp", &port])?;
    sleep(Duration::from_millis(300));
    let secs = seconds.to_string();
    let args = ["-lp", &port, "-t", &secs, "-m", "1", &pair.dial_ip, test];
    let out = crate::proc::output_in(&pair.client_ns, Some(cpu), "qperf", &args)?;
    Ok(2.0 * one_way_us(&out)?)
}

/// The value of qperf's "    latency  =  3.89 us" line, in µs.
fn one_way_us(out: &str) -> Result<f64> {
    let line = out.lines().find_map(|l| l.trim().strip_prefix("latency")).with_context(|| format!("qperf: {out}"))?;
    let mut words = line.trim_start_matches([' ', '=']).split_whitespace();
    let value: f64 = words.next().context("no latency value")?.parse()?;
    Ok(match words.next() {
        Some("ns") => value / 1e3,
        Some("us") => value,
        Some("ms") => value * 1e3,
        Some("sec") => value * 1e6,
        unit => bail!("qperf latency in unknown unit {unit:?}: {out}"),
    })
}

#[cfg(test)]
mod tests {
    use super::one_way_us;

    #[test]
    fn reads_qperf_latency_in_any_unit() {
        assert_eq!(one_way_us("tcp_lat:\n    latency  =  3.89 us\n").unwrap(), 3.89);
        assert_eq!(one_way_us("udp_lat:\n    latency  =  1.5 ms\n").unwrap(), 1500.0);
        assert!(one_way_us("qperf: failed to connect").is_err());
    }
}
