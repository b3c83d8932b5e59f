//! Churn on a masquerading node that is busy: a resident pod talks to the external server
//! through the masquerade path the whole time, and `ebpf-cni agent` runs on the node (its
//! metrics scraped every round, its resident set sampled). After the cycles, GC with the
//! resident pod valid must leave exactly it (its one flow in NAT, the pins it started with),
//! and its DEL nothing.
use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::json;

use super::{
    churn::{ChurnPlan, churn},
    faults::Killer,
    masq_stream::{MasqStream, StreamStats},
    memory::{Series, resident_kib},
    state,
};
use crate::{Cluster, EXT_SERVER, agent::RunningAgent, prometheus};

#[derive(Clone, Debug, Default)]
pub struct ChurnFigures {
    pub cycles: usize,
    pub duplicates: usize,
    pub plugin_rss: Series,
    pub agent_rss: Series,
    pub traffic: StreamStats,
    /// The datapath's drop counters over the churn: (reason number, packets).
    pub drops: Vec<(u64, u64)>,
    pub wall: Duration,
    pub gc: Vec<String>,
    pub leaks: Vec<String>,
    pub failures: Vec<String>,
}

/// Where the agent serves its metrics: the node namespace's loopback.
const METRICS_AT: &str = "127.0.0.1:9962";
/// The resident pod's stream goes to this port of the external server.
const ECHO_PORT: u16 = 7;

/// `cycles` ADD/DEL cycles, `batch` at once, on node 1 of `c`.
pub fn busy_churn(c: &mut Cluster, killer: &Killer, cycles: usize, batch: usize) -> Result<ChurnFigures> {
    let ext = c.ext.name.clone();
    let tb = &mut c.nodes[0];
    let resident = tb.new_pod()?;
    let resident_ip: Ipv4Addr = tb.add(resident)?.parse()?;
    let pins_before = state::pins(tb);
    let server = SocketAddrV4::new(EXT_SERVER.parse()?, ECHO_PORT);
    let stream = MasqStream::start(&tb.pods[resident].netns.name, &ext, server)?;
    let agent = start_agent(tb)?;
    let mut agent_rss = Series::default();
    agent_rss.push(0, resident_kib(agent.child.id())?);
    let metrics: SocketAddr = METRICS_AT.parse()?;
    let plan = ChurnPlan { cycles, batch, masq_to: Some(SocketAddrV4::new(*server.ip(), 9)), report_fds: false };
    let started = Instant::now();
    let outcome = churn(tb, killer, &plan, &[resident_ip], |tb, cycles_done| {
        // A scrape walks every map of the network: the agent's busiest path.
        let (status, _, _) = prometheus::http_get(&tb.node.name, metrics, "/metrics")?;
        anyhow::ensure!(status.contains("200"), "metrics: {status}");
        agent_rss.push(cycles_done - 1, resident_kib(agent.child.id())?);
        Ok(())
    })?;
    let wall = started.elapsed();
    let traffic = stream.stop()?;
    let drops = tb.all_drops()?;
    drop(agent);

    let mut gc = vec![tb.gc_report(&[resident])?];
    let mut leaks = state::mismatches(tb, 1)?;
    // The resident pod's one flow, both ways; the gone pods' were swept.
    let nat = tb.map_len("NAT")?;
    if nat != 2 {
        leaks.push(format!("{nat} NAT entries for one flow"));
    }
    let pins_after = state::pins(tb);
    if pins_after != pins_before {
        leaks.push(format!("pins {pins_after:?}, were {pins_before:?} with the resident pod alone"));
    }
    tb.del(resident)?;
    gc.push(tb.gc_report(&[])?);
    leaks.extend(tb.leftovers()?);
    Ok(ChurnFigures {
        cycles: outcome.cycles,
        duplicates: outcome.duplicates,
        plugin_rss: outcome.plugin_rss,
        agent_rss,
        traffic,
        drops,
        wall,
        gc,
        leaks,
        failures: outcome.failures,
    })
}

/// The agent on node 1, with a node list of itself alone (no route to manage: the cluster's
/// hand-made route to node 2 stays), metrics on the node's loopback, no node file.
fn start_agent(tb: &crate::Testbed) -> Result<RunningAgent> {
    let nodes = tb.data_dir().with_file_name("nodes.json");
    let list = json!({ "items": [{ "metadata": { "name": "node-1" }, "spec": { "podCIDR": tb.subnet } }] });
    std::fs::write(&nodes, list.to_string()).context("writing the node list")?;
    let no_node_file = tb.data_dir().with_file_name("no-node.json");
    let args = [
        "--nodes-file",
        nodes.to_str().context("path")?,
        "--node-conf",
        no_node_file.to_str().context("path")?,
        "--interval",
        "1",
        "--metrics-addr",
        METRICS_AT,
    ];
    let agent = RunningAgent::start(tb, "node-1", &args)?;
    // Up once it serves its first page.
    let at: SocketAddr = METRICS_AT.parse()?;
    let started = Instant::now();
    while prometheus::http_get(&tb.node.name, at, "/metrics").is_err() {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(20), "the agent never served: {}", agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(agent)
}
