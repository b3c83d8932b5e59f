//! `from_pod`'s time on live traffic, where `BPF_PROG_TEST_RUN` (`policy_cost.rs`) cannot
//! look: each new connection's packets meet maps whose entries the kernel's own work between
//! two connections has pushed out of the caches, while a test run repeats one packet on hot
//! ones. The kernel's run-time statistics (`BPF_ENABLE_STATS`, on only while its descriptor is
//! open, so nothing is left on when the bench ends) count every run's time and number; a short
//! connection-rate run of its own, because the statistics' two clock reads per run would weigh
//! on the measured rate.
use std::{net::SocketAddrV4, time::Duration};

use anyhow::{Context, Result};
use aya::{
    programs::SchedClassifier,
    sys::{Stats, enable_stats},
};

use crate::{conn_rate, sockperf::LATENCY_CPU, topology::Pair};

const SECONDS: u32 = 2;

/// `from_pod`'s mean time per run (ns) and per connection (ns, every packet of it either way:
/// both pods' packets enter through `from_pod`), over `SECONDS` of connections from `pair`'s
/// client to `listen`, client and server on the ping-pong's CPU as the rate's own figure.
pub fn from_pod_per_connection(pair: &Pair, listen: SocketAddrV4) -> Result<(f64, f64)> {
    let tb = pair.node().context("a CNI path has a node")?;
    let pin = tb.loaded_version_dir().join("progs").join("from_pod");
    let program = SchedClassifier::from_pin(&pin).with_context(|| format!("opening {}", pin.display()))?;
    let _stats = enable_stats(Stats::RunTime).context("enabling BPF run-time statistics")?;
    let before = program.info()?;
    let rate = conn_rate::per_second_in_process(
        &pair.client_ns,
        None,
        &pair.server_ns,
        listen,
        listen,
        SECONDS,
        Some(LATENCY_CPU),
    )?;
    let after = program.info()?;
    let time = after.run_time().saturating_sub(before.run_time());
    let runs = after.run_count().saturating_sub(before.run_count()).max(1);
    let connections = (rate * f64::from(SECONDS)).max(1.0);
    let ns = |d: Duration| d.as_secs_f64() * 1e9;
    Ok((ns(time) / runs as f64, ns(time) / connections))
}
