//! Control plane: wall time of ADD and DEL as a runtime sees it (exec to exit): the first ADD
//! on a fresh node (`cold.rs`), then ADD and DEL with 1, 100 and 1,000 pods already on the
//! node, the node's iptables ruleset at each level, and how flat ADD and DEL stay (p50 at the
//! highest level over p50 at the lowest: nothing a verb does may grow with the pods). Each plugin
//! has its own node, alone on the machine while it is measured; at every level each round adds
//! a batch of pods and deletes it again, so the level holds while it is measured. Both
//! masquerade (bridge's `ipMasq` with iptables, ours in BPF on the node's uplink), as a node
//! that sends pods outside does.
use anyhow::{Result, ensure};
use ebpf_cni_tests::{Plugin, Testbed, run_in};
use serde_json::Value;

use crate::{
    Settings,
    report::{self, Better::*, Figure},
    stats::Samples,
    topology::{Family, Path},
};

const SECTION: &str = "control plane";

pub(crate) struct Node {
    pub path: Path,
    tb: Testbed,
    conf: Value,
    /// `EBPF_CNI_NODE_CONF`, once [`Node::preload`] wrote a node file.
    node_conf: Option<String>,
    /// Pods attached now (`tb.pods` also holds the deleted ones' namespaces).
    attached: usize,
}

impl Node {
    /// A fresh node with an uplink (a veth pair inside it, the default route out of one end),
    /// which ebpf-cni masquerades on.
    pub fn new(path: Path, ours: &Plugin) -> Result<Self> {
        let tag = if path == Path::EbpfCni { "cpe" } else { "cpb" };
        let tb = Testbed::with_plugin(tag, "10.244.0.0/16", path.plugin(ours))?;
        let node = tb.node.name.as_str();
        run_in(node, "ip", &["link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1"])?;
        for link in ["uplink0", "uplink1"] {
            run_in(node, "ip", &["link", "set", link, "up"])?;
        }
        run_in(node, "ip", &["addr", "add", "192.0.2.1/24", "dev", "uplink0"])?;
        run_in(node, "ip", &["route", "add", "default", "via", "192.0.2.2"])?;
        let mut conf = path.conf(&tb, Family::V4);
        conf["ipMasq"] = serde_json::json!(true);
        Ok(Self { path, tb, conf, node_conf: None, attached: 0 })
    }

    /// What the DaemonSet does before a node's first pod: the installer's node file (this
    /// network primary, masquerading, the pods' CIDR) and `ebpf-cni agent`, which loads the
    /// network's datapath ahead (`--once` here: the routes part has no other node to route to).
    pub fn preload(&mut self) -> Result<()> {
        let path = self.tb.data_dir().with_file_name("node.json");
        let node = serde_json::json!({
            "primaryNetwork": self.tb.network,
            "ipMasq": true,
            "podCIDRs": [self.tb.subnet],
            "bpffsRoot": self.tb.bpffs_root(),
            "ipamDataDir": self.tb.data_dir(),
        });
        std::fs::write(&path, node.to_string())?;
        let nodes = self.tb.data_dir().with_file_name("nodes.json");
        std::fs::write(&nodes, r#"{"items": []}"#)?;
        let (path, nodes) = (path.to_string_lossy().into_owned(), nodes.to_string_lossy().into_owned());
        let root = self.tb.bpffs_root().to_string_lossy().into_owned();
        let args =
            ["agent", "--once", "--node", "n1", "--bpffs-root", &root, "--nodes-file", &nodes, "--node-conf", &path];
        let out = run_in(&self.tb.node.name, &self.tb.plugin.binary.to_string_lossy(), &args)?;
        ensure!(String::from_utf8_lossy(&out.stderr).contains("loaded network"), "the agent loaded nothing");
        self.node_conf = Some(path);
        Ok(())
    }

    /// ADDs one new pod; returns its index and the wall time in ms.
    pub fn add(&mut self) -> Result<(usize, f64)> {
        let pod = self.tb.new_pod()?;
        let out = self.verb("ADD", pod)?;
        ensure!(out.success, "{} ADD failed: {}", self.path.name(), out.stdout);
        self.attached += 1;
        Ok((pod, out.elapsed.as_secs_f64() * 1e3))
    }

    pub fn del(&mut self, pod: usize) -> Result<f64> {
        let out = self.verb("DEL", pod)?;
        ensure!(out.success, "{} DEL failed: {}", self.path.name(), out.stdout);
        self.attached -= 1;
        Ok(out.elapsed.as_secs_f64() * 1e3)
    }

    /// Starts a DEL of each of `pods`, each from its own thread, and [`ADD_DELAY`] later, with
    /// every DEL running, an ADD of a new pod: the ADD then waits for the node's lock behind
    /// those DELs that hold or want it. Returns the new pod and the wall times of all of them.
    pub fn add_behind_dels(&mut self, pods: &[usize]) -> Result<Contended> {
        let pod = self.tb.new_pod()?;
        let this = &*self;
        let start = std::sync::Barrier::new(pods.len() + 1);
        let (add, dels) = std::thread::scope(|scope| {
            let dels: Vec<_> = pods
                .iter()
                .map(|&del| {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        let out = this.verb("DEL", del)?;
                        ensure!(out.success, "DEL failed: {}", out.stdout);
                        Ok((out.elapsed, std::time::Instant::now()))
                    })
                })
                .collect();
            start.wait();
            std::thread::sleep(ADD_DELAY);
            let out = this.verb("ADD", pod);
            let ended = std::time::Instant::now();
            let dels: Vec<Result<_>> = dels.into_iter().map(|t| t.join().expect("a DEL thread panicked")).collect();
            (out.map(|o| (o, ended)), dels)
        });
        let (add, add_ended) = add?;
        ensure!(add.success, "ADD behind DELs failed: {}", add.stdout);
        let dels = dels.into_iter().collect::<Result<Vec<_>>>()?;
        self.attached = self.attached + 1 - pods.len();
        Ok(Contended {
            pod,
            add_ms: add.elapsed.as_secs_f64() * 1e3,
            dels_ms: dels.iter().map(|(elapsed, _)| elapsed.as_secs_f64() * 1e3).collect(),
            dels_ended_first: dels.iter().filter(|(_, ended)| *ended < add_ended).count(),
        })
    }

    pub fn testbed(&self) -> &Testbed {
        &self.tb
    }

    fn verb(&self, verb: &str, pod: usize) -> Result<ebpf_cni_tests::CniOutput> {
        let netns = self.tb.pods[pod].netns_path();
        let env: Vec<(&str, &str)> = self.node_conf.iter().map(|p| ("EBPF_CNI_NODE_CONF", p.as_str())).collect();
        self.tb.cni_env(verb, pod, &self.conf, &netns, &env)
    }

    /// Lines of `iptables-save` in the node (rules, chains and table headers).
    fn iptables_lines(&self) -> Result<f64> {
        let out = run_in(&self.tb.node.name, "iptables-save", &[])?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')).count() as f64)
    }
}

/// How long after the DELs of [`Node::add_behind_dels`] the ADD starts: time for every DEL to
/// exec and reach the lock's queue (a DEL deletes its veth, a few ms, before it asks for the lock).
const ADD_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// An ADD started while DELs ran: see [`Node::add_behind_dels`].
pub struct Contended {
    pub pod: usize,
    pub add_ms: f64,
    pub dels_ms: Vec<f64>,
    /// DELs that exited before the ADD did (the lock is a `flock`: no queue order is promised).
    pub dels_ended_first: usize,
}

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let mut figures = crate::cold::run(s, ours)?;
    let mut levels: Vec<Level> = s.pod_levels.iter().map(|&pods| Level::new(pods)).collect();
    // One plugin's node at a time, as a real node runs one plugin. With both nodes filled the
    // machine held 2,000 pods' namespaces and veths at the top level, and what the kernel keeps
    // machine-wide for them made each plugin's verbs pay for the other's pods too: ebpf-cni's
    // ADD at 1,000 pods read 1.31–1.33× its 1-pod time that way, 1.10× in the same batches on
    // its node alone (`--add-loop`'s node). A node and its pods go before the next plugin's
    // are added; within a level the rounds run back to back.
    for path in Path::PLUGINS {
        let mut node = Node::new(path, ours)?;
        for level in &mut levels {
            while node.attached < level.pods {
                node.add()?;
            }
            level.rules.record(path, node.iptables_lines()?);
            for round in 0..s.rounds {
                crate::cpu::wait_idle()?;
                let (mut adds, mut dels) = (Samples::default(), Samples::default());
                let mut batch = Vec::new();
                for _ in 0..s.batch {
                    let (pod, ms) = node.add()?;
                    batch.push(pod);
                    adds.push(ms);
                }
                for pod in batch {
                    dels.push(node.del(pod)?);
                }
                eprintln!(
                    "control {:4} pods round {round} {:8}: ADD p50 {:.1} ms, DEL p50 {:.1} ms",
                    level.pods,
                    path.name(),
                    adds.median(),
                    dels.median()
                );
                level.record(path, &adds, &dels);
            }
        }
    }
    let (first, top) = (levels.first().map(|l| l.pods), levels.last().map(|l| l.pods));
    let add_p50_by_level: Vec<_> = levels.iter().map(|l| medians(&l.add)).collect();
    let del_p50_by_level: Vec<_> = levels.iter().map(|l| medians(&l.del)).collect();
    for level in levels {
        figures.extend([level.add, level.add99, level.del, level.del99, level.rules]);
    }
    // Flat: p50 at the highest level over p50 at the lowest.
    if let (Some(first), Some(top)) = (first, top) {
        for (verb, by_level) in [("ADD", &add_p50_by_level), ("DEL", &del_p50_by_level)] {
            figures.push(flatness(verb, by_level, first, top));
        }
    }
    Ok(figures)
}

/// One pod level's figures, both plugins' values.
struct Level {
    pods: usize,
    add: Figure,
    add99: Figure,
    del: Figure,
    del99: Figure,
    rules: Figure,
}

impl Level {
    fn new(level: usize) -> Self {
        let bridge = Some(Path::Bridge);
        Self {
            pods: level,
            add: Figure::new(SECTION, format!("ADD p50, {}", pods(level)), "ms", Lower).target(bridge, 0.4),
            add99: Figure::new(SECTION, format!("ADD p99, {}", pods(level)), "ms", Lower).pooled_p99(),
            del: Figure::new(SECTION, format!("DEL p50, {}", pods(level)), "ms", Lower).target(bridge, 0.2),
            del99: Figure::new(SECTION, format!("DEL p99, {}", pods(level)), "ms", Lower).pooled_p99(),
            rules: Figure::new(SECTION, format!("iptables-save lines, {}", pods(level)), "lines", Lower),
        }
    }

    fn record(&mut self, path: Path, adds: &Samples, dels: &Samples) {
        self.add.record(path, adds.median());
        self.del.record(path, dels.median());
        self.add99.record_round(path, adds);
        self.del99.record_round(path, dels);
    }
}

/// Each path's median of a figure.
fn medians(figure: &Figure) -> Vec<(Path, f64)> {
    figure.values.iter().map(|(p, s)| (*p, s.median())).collect()
}

/// `verb`'s p50 at the highest pod level over its p50 at the lowest, per path.
fn flatness(verb: &str, by_level: &[Vec<(Path, f64)>], first: usize, top: usize) -> Figure {
    let name = format!("{verb} p50 at {} ÷ at {}", pods(top), pods(first));
    let mut flat = Figure::new(SECTION, name, "×", Lower).target(None, 1.1);
    if let (Some(at_first), Some(at_top)) = (by_level.first(), by_level.last()) {
        for (path, low) in at_first {
            if let Some((_, high)) = at_top.iter().find(|(p, _)| p == path) {
                flat.record(*path, high / low);
            }
        }
    }
    flat
}

/// `1 pod`, `1,000 pods`: a pod level as the tables name it.
fn pods(n: usize) -> String {
    if n == 1 { "1 pod".into() } else { format!("{} pods", report::thousands(n)) }
}
