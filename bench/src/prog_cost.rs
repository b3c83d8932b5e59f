//! A pinned program's cost per packet in the kernel (`BPF_PROG_TEST_RUN`), by the method that
//! holds for its frame. The kernel runs a test's repeats on one buffer: a program that leaves
//! the packet's headers as they were takes the same path every time, and the mean over a million
//! repeats is its cost. One that rewrites them (masquerade, a Service's translation) would, from
//! the second repeat on, time the rewritten packet's path instead: it is timed by single runs on
//! fresh copies. A single run's time also holds the run's fixed cost (the clock read around it,
//! the program's entry), so the median of the same single runs on a frame every program leaves
//! at its first test (not IP) is taken off, and that frame's own cost by repeats added back.
use anyhow::{Result, ensure};
use ebpf_cni_tests::{Testbed, prog_run};

use crate::stats::Samples;

/// Where every program of the uplink section runs.
pub const UPLINK: &str = "eth0";
const ETH_LEN: usize = 14;
/// Timings per program and frame; the value is their median.
const TIMINGS: usize = 5;

/// How many runs a timing takes.
#[derive(Clone, Copy)]
pub struct Runs {
    /// Repeats of one test run, for a frame the program leaves as it was.
    pub repeat: u32,
    /// Single runs, for a frame it rewrites.
    pub singles: usize,
}

/// What a program made of a frame, and what that cost.
pub struct Timed {
    pub verdict: u32,
    /// The frame as the program left it: what the next filter on the uplink gets.
    pub out: Vec<u8>,
    pub ns: f64,
    /// Whether the program rewrote the packet's headers.
    pub rewrote: bool,
}

/// `program`'s cost per packet on `frame`, on the node's uplink; by single runs if it rewrites
/// the frame or if `singles` (so that figures compared with such a one are timed alike: single
/// runs come out 10–25 % above repeats of the same packet, their caches less warm).
pub fn cost(tb: &Testbed, program: &str, frame: &[u8], runs: Runs, singles: bool) -> Result<Timed> {
    let (verdict, out, _) = prog_run::time_each(tb, program, UPLINK, frame.to_vec(), 1)?;
    let rewrote = out.get(ETH_LEN..) != frame.get(ETH_LEN..);
    let same = |v: u32| -> Result<()> {
        ensure!(v == verdict, "{program}: verdict {verdict}, then {v}");
        Ok(())
    };
    let mut samples = Samples::default();
    if !rewrote && !singles {
        for _ in 0..TIMINGS {
            let (v, mean) = prog_run::time(tb, program, UPLINK, frame.to_vec(), runs.repeat)?;
            same(v)?;
            samples.push(mean.as_secs_f64() * 1e9);
        }
    } else {
        let not_ip = not_ip(frame);
        let own = floor(tb, program, frame, runs)?;
        for _ in 0..TIMINGS {
            let (v, _, times) = prog_run::time_each(tb, program, UPLINK, frame.to_vec(), runs.singles)?;
            same(v)?;
            let (_, _, fixed) = prog_run::time_each(tb, program, UPLINK, not_ip.clone(), runs.singles)?;
            samples.push(median_ns(&times) - median_ns(&fixed) + own);
        }
    }
    Ok(Timed { verdict, out, ns: samples.median(), rewrote })
}

/// `program`'s cost per run, by repeats, on `frame` made a non-IP one (ARP): the floor of any
/// figure here (the test run's own loop, the program's entry and first test).
pub fn floor(tb: &Testbed, program: &str, frame: &[u8], runs: Runs) -> Result<f64> {
    let (_, mean) = prog_run::time(tb, program, UPLINK, not_ip(frame), runs.repeat)?;
    Ok(mean.as_secs_f64() * 1e9)
}

fn not_ip(frame: &[u8]) -> Vec<u8> {
    [&frame[..12], &[0x08, 0x06], &[0; 28][..]].concat()
}

fn median_ns(times: &[std::time::Duration]) -> f64 {
    times.iter().map(|t| t.as_secs_f64() * 1e9).collect::<Samples>().median()
}

/// The cost per packet of an ingress program on `ifname` that rewrites `frame` and redirects
/// it (a pod's packet sent to another node, one delivered into a pod): [`cost`]'s single runs,
/// the frame arriving on `ifname` (`ingress_ifindex`, which such a program checks).
pub fn redirect_cost(tb: &Testbed, program: &str, ifname: &str, frame: &[u8], runs: Runs) -> Result<Timed> {
    let each = |frame: Vec<u8>| prog_run::time_each_arrived(tb, program, ifname, ifname, frame, runs.singles);
    let (verdict, out, _) = prog_run::time_each_arrived(tb, program, ifname, ifname, frame.to_vec(), 1)?;
    let (_, own) = prog_run::time(tb, program, ifname, not_ip(frame), runs.repeat)?;
    let mut samples = Samples::default();
    for _ in 0..TIMINGS {
        let (v, _, times) = each(frame.to_vec())?;
        ensure!(v == verdict, "{program}: verdict {verdict}, then {v}");
        let (_, _, fixed) = each(not_ip(frame))?;
        samples.push(median_ns(&times) - median_ns(&fixed) + own.as_secs_f64() * 1e9);
    }
    let rewrote = out.get(ETH_LEN..) != frame.get(ETH_LEN..) || out.get(..ETH_LEN) != frame.get(..ETH_LEN);
    Ok(Timed { verdict, out, ns: samples.median(), rewrote })
}
