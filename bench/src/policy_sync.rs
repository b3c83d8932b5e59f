//! A NetworkPolicy change → the datapath's verdict, at 1,000 policies: `ebpf-cni agent` reads
//! the cluster of `policy_set.rs` (namespaces, 1,002 pods, the policies) from a fake API server
//! (`ebpf_cni_tests::FakeStore`, the API's own JSON) on a fresh node of two pods. Timed:
//! - from the agent's start until a port no policy allows is closed (every policy enforced);
//! - one after another, from the store's write of a change until new connections from the client
//!   to the server's probe port get the new verdict: the `probe` policy's port toggled (a policy
//!   change), then the server's `probe` label toggled (a pod label change: its identity changes,
//!   and every rule of the policies selecting it is written for the new one).
//!
//! The verdict is what the datapath does, not what the maps hold: a thread in the client pod
//! connects to the probe port again and again, a new connection (a new flow) each time. The
//! time of a change is the start of the first connection attempt that got the new verdict, so
//! it errs late by at most one attempt: an attempt towards "allowed" gives up after
//! `DENIED_AFTER_OPENING` (the resolution of a deny → allow change), a successful one takes a
//! fraction of a millisecond (the resolution of allow → deny). A denial counts only when the
//! two attempts after it fail too (a slow handshake on a busy machine is not a denial).
use std::{
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use ebpf_cni_tests::{
    FakeStore, Plugin,
    agent::RunningAgent,
    fake_store::{NAMESPACES, NETWORK_POLICIES, NODES, PODS},
    traffic::{in_netns, tcp_listener},
};
use serde_json::json;

use crate::{
    policy_set::{self, CLOSED_PORT, Cluster, PROBE_PORT},
    report::{self, Better::*, Figure},
    stats::Samples,
    topology::{self, Family, Path},
};

const SECTION: &str = "NetworkPolicy change → datapath";
const API: &str = "127.0.0.1:6443";
/// How long an attempt waits for its handshake while the port is expected to open.
const DENIED_AFTER_OPENING: Duration = Duration::from_millis(2);
/// How long an attempt waits while the port is expected to close: a handshake on this VM
/// takes well under a millisecond, but a busy machine can stall one for more.
const DENIED_AFTER_CLOSING: Duration = Duration::from_millis(50);
/// A change slower than this is a failure of the agent, not a figure.
const CHANGE_LIMIT: Duration = Duration::from_secs(5);

/// One round: the agent's start, and every change of each kind.
pub struct Round {
    pub start_ms: f64,
    pub policy_ms: Samples,
    pub label_ms: Samples,
}

impl Round {
    pub fn summary(&self) -> String {
        format!(
            "enforced {:.0} ms after the agent's start; a policy change p50 {:.1} ms p99 {:.1} ms, a pod label change \
             p50 {:.1} ms p99 {:.1} ms",
            self.start_ms,
            self.policy_ms.median(),
            self.policy_ms.p99(),
            self.label_ms.median(),
            self.label_ms.p99()
        )
    }
}

/// The section's figures over rounds.
pub struct Figures {
    start: Figure,
    kinds: [(Figure, Figure, Figure); 2],
    slowest: [f64; 2],
}

impl Figures {
    pub fn new(policies: usize) -> Self {
        let at = report::thousands(policies);
        let kind = |what: &str| {
            (
                Figure::new(SECTION, format!("{what} → new connections' verdict p50, {at} policies"), "ms", Lower)
                    .own_columns(),
                Figure::new(SECTION, format!("{what} → new connections' verdict p99, {at} policies"), "ms", Lower)
                    .own_columns()
                    .pooled_p99()
                    .target(None, 100.0),
                Figure::new(
                    SECTION,
                    format!("{what} → new connections' verdict, slowest of all, {at} policies"),
                    "ms",
                    Lower,
                )
                .own_columns()
                .target(None, 1000.0),
            )
        };
        Self {
            start: Figure::new(SECTION, format!("agent start → {at} policies enforced"), "ms", Lower).own_columns(),
            kinds: [kind("policy change"), kind("pod label change")],
            slowest: [0.0; 2],
        }
    }

    pub fn record(&mut self, round: &Round) {
        self.start.record(Path::EbpfCni, round.start_ms);
        for (i, samples) in [&round.policy_ms, &round.label_ms].into_iter().enumerate() {
            let (p50, p99, _) = &mut self.kinds[i];
            p50.record(Path::EbpfCni, samples.median());
            p99.record_round(Path::EbpfCni, samples);
            self.slowest[i] = samples.range().map_or(self.slowest[i], |(_, max)| max.max(self.slowest[i]));
        }
    }

    pub fn figures(self) -> Vec<Figure> {
        let mut all = vec![self.start];
        for ((p50, p99, mut slowest), max) in self.kinds.into_iter().zip(self.slowest) {
            slowest.record(Path::EbpfCni, max);
            all.extend([p50, p99, slowest]);
        }
        all
    }
}

/// `policies` policies, then `changes` changes of each kind.
pub fn measure(ours: &Plugin, policies: usize, changes: usize) -> Result<Round> {
    let pair = topology::build(Path::EbpfCni, ours, Family::V4)?;
    let tb = pair.node().context("a CNI path has a node")?;
    let server: Ipv4Addr = pair.server_ip.parse()?;
    let cluster = Cluster { client: crate::policy::client_ip(&pair)?, server, node: "node-1" };
    let _servers = Servers::start(&pair.server_ns, server)?;
    let store = Arc::new(FakeStore::start(&tb.node.name, API.parse()?));
    let node = json!({ "metadata": { "name": "node-1" }, "spec": { "podCIDR": tb.subnet },
                       "status": { "addresses": [{ "type": "InternalIP", "address": "192.0.2.10" }] } });
    store.put(NODES, [node]);
    store.put(NAMESPACES, cluster.namespaces());
    store.put(PODS, cluster.pods(true));
    store.put(NETWORK_POLICIES, cluster.policies(policies, true));
    // No Service LB: only the policy maps matter here.
    let node_file = topology::node_file_with(tb, json!({}))?;
    let started = Instant::now();
    // The names file in the node's directory, never the machine's /run/ebpf-cni.
    let names = tb.data_dir().with_file_name("policy-names.json");
    let names = names.to_string_lossy();
    let api = format!("http://{API}");
    let args = ["--api-server", &api, "--node-conf", &node_file, "--interval", "5", "--policy-names", &names];
    let agent = RunningAgent::start(tb, "node-1", &args)?;
    let (probe, closed) = (SocketAddrV4::new(server, PROBE_PORT), SocketAddrV4::new(server, CLOSED_PORT));
    let client_ns = pair.client_ns.clone();
    let outcome = in_netns(&client_ns, move || -> Result<Round> {
        // Enforced: the closed port refuses, the probe port (open in the policy) connects.
        let enforced = first_verdict(closed, false, Duration::from_secs(60), started)?;
        let start_ms = enforced.map(|at| at.duration_since(started).as_secs_f64() * 1e3);
        let start_ms = start_ms.context("no policy enforced 60 s after the agent's start")?;
        first_verdict(probe, true, CHANGE_LIMIT, Instant::now())?.context("the probe port does not open")?;
        let mut round = Round { start_ms, policy_ms: Samples::default(), label_ms: Samples::default() };
        let server_pod = |labelled: bool| cluster.pods(labelled).swap_remove(1);
        for label_change in [false, true] {
            let mut open = true;
            for change in 0..changes {
                open = !open;
                let written = Instant::now();
                if label_change {
                    store.put(PODS, [server_pod(open)]);
                } else {
                    store.put(NETWORK_POLICIES, [policy_set::probe(open)]);
                }
                let seen = first_verdict(probe, open, CHANGE_LIMIT, written)?
                    .with_context(|| format!("change {change} not in the datapath after {CHANGE_LIMIT:?}"))?;
                let ms = seen.duration_since(written).as_secs_f64() * 1e3;
                if label_change {
                    round.label_ms.push(ms)
                } else {
                    round.policy_ms.push(ms)
                }
                // Apart, so that each change is its own event rather than a burst the agent batches.
                sleep(Duration::from_millis(30));
            }
            if !open {
                // The next kind starts from an open probe port.
                if label_change {
                    store.put(PODS, [server_pod(true)])
                } else {
                    store.put(NETWORK_POLICIES, [policy_set::probe(true)])
                };
                first_verdict(probe, true, CHANGE_LIMIT, Instant::now())?
                    .context("the probe port does not open again")?;
            }
        }
        Ok(round)
    });
    match outcome {
        Ok(round) => Ok(round),
        Err(e) => bail!("{e:#}; the agent's log:\n{}", agent.log()),
    }
}

/// Connects to `to` until an attempt gets the verdict `allowed` (a denial confirmed by the next
/// two attempts); the start of that attempt, or None after `limit` from `since`. Runs in the
/// client pod's namespace.
fn first_verdict(to: SocketAddrV4, allowed: bool, limit: Duration, since: Instant) -> Result<Option<Instant>> {
    let patience = if allowed { DENIED_AFTER_OPENING } else { DENIED_AFTER_CLOSING };
    let attempt = || TcpStream::connect_timeout(&to.into(), patience).is_ok();
    while since.elapsed() < limit {
        let at = Instant::now();
        if attempt() == allowed && (allowed || (!attempt() && !attempt())) {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// Listeners on the server's probe and closed ports that accept and drop every connection (so
/// that the backlog never fills), until dropped.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Servers {
    fn start(server_ns: &str, server: Ipv4Addr) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for port in [PROBE_PORT, CLOSED_PORT] {
            let listener: TcpListener = tcp_listener(server_ns, SocketAddrV4::new(server, port))?;
            listener.set_nonblocking(true)?;
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if listener.accept().is_err() {
                        sleep(Duration::from_micros(200));
                    }
                }
            }));
        }
        Ok(Self { stop, threads })
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
