//! The cluster the cases run on: the dual-stack LAN topology (two nodes, host-gw routes), a
//! node file per node naming the primary network (what enables policy in the agent), one fake
//! API server on the LAN's host that both nodes' agents watch, and the nine pods, each ADDed
//! through its node's runtime with kubelet's `CNI_ARGS` and serving TCP and UDP on 80 and 81.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddrV4},
    os::unix::fs::PermissionsExt as _,
    panic::AssertUnwindSafe,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    expect::Reachability,
    model::{Family, NAMESPACES, PodRef},
    objects,
    probe::{Probe, probe_once},
    suite::Tally,
    table,
};
use crate::{
    FakeStore,
    agent::RunningAgent,
    cgroup::TestCgroup,
    fake_store::{NAMESPACES as NAMESPACES_PATH, NETWORK_POLICIES, NODES, PODS},
    lan::{Ipv6Plan, LAN_HOST, LAN_NODE_IPS, LAN_NODE_IPV6S, Lan, LanPod},
    service_probe::Tagged,
};

/// A probe's first try; a denied TCP probe takes this long (its SYN is dropped).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// The one retry of a probe expected to connect that did not (a busy machine, a first ARP).
pub const RETRY_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long after a change a check keeps probing for the expected matrix (the agent's target
/// is 1 s; a debug build on a busy 2-CPU machine gets room).
pub const SETTLE: Duration = Duration::from_secs(5);
pub const API_PORT: u16 = 6443;
pub const NODE_NAMES: [&str; 2] = ["node-1", "node-2"];

/// Address plan and switches of one test file's cluster.
#[derive(Clone, Copy)]
pub struct Options {
    pub tag: &'static str,
    pub cluster_cidr: &'static str,
    pub subnets: [&'static str; 2],
    pub ipv6: Ipv6Plan<'static>,
    /// The node files turn `kubeProxyReplacement` on (the socket LB in a test cgroup).
    pub kube_proxy_replacement: bool,
}

/// One pod and its servers.
pub struct ServedPod {
    pub pod: LanPod,
    pub node: usize,
    /// Its index among its node's testbed pods (for DEL).
    pub index: usize,
    _servers: [Tagged; 2],
}

impl ServedPod {
    pub fn ip(&self, family: Family) -> IpAddr {
        match family {
            Family::V4 => self.pod.ip.into(),
            Family::V6 => self.pod.ip6.expect("a dual-stack pod").into(),
        }
    }
}

/// Fields drop in order: agents, the API server, the pods' servers, then the topology.
pub struct NetpolCluster {
    pub agents: Vec<RunningAgent>,
    pub store: FakeStore,
    pub pods: BTreeMap<PodRef, ServedPod>,
    pub tally: Tally,
    pub cgroup: Option<TestCgroup>,
    pub lan: Lan,
    pub node_files: Vec<PathBuf>,
    /// `ns/name` of the NetworkPolicies in the store.
    policies: BTreeSet<String>,
    /// Labels or pods changed by the running case: put back before the next.
    dirty: bool,
    /// The pods the base matrix has.
    base_pods: Vec<PodRef>,
    case: String,
    changed_at: Instant,
}

impl NetpolCluster {
    /// The cluster for test `name`, or `None` off CI without root (see `require_privileges`).
    pub fn for_test(name: &str, options: Options) -> Option<Self> {
        let lan = Lan::for_test_dual_stack(name, options.tag, options.cluster_cidr, options.subnets, options.ipv6)?;
        Some(Self::build(lan, options).expect("building the network-policy cluster"))
    }

    fn build(mut lan: Lan, options: Options) -> anyhow::Result<Self> {
        let cgroup = match options.kube_proxy_replacement {
            true => Some(TestCgroup::create(&format!("{}-netpol", lan.nodes[0].run_id))?),
            false => None,
        };
        let mut node_files = Vec::new();
        for node in 0..2 {
            let path = node_file(&lan, node, options, cgroup.as_ref())?;
            lan.use_node_conf(node, &path);
            node_files.push(path);
        }
        let api: SocketAddrV4 = SocketAddrV4::new(LAN_HOST.parse()?, API_PORT);
        let store = FakeStore::start(&lan.host.name, api);
        store.put(NODES, (0..2).map(node_object));
        store.put(NAMESPACES_PATH, NAMESPACES.iter().map(|ns| objects::namespace(ns, &[])));
        let mut agents = Vec::new();
        for (node, path) in node_files.iter().enumerate() {
            let args = [
                "--api-server",
                &format!("http://{api}"),
                "--node-conf",
                path.to_str().unwrap_or_default(),
                "--interval",
                "5",
            ];
            // `RunningAgent::start` puts the policy names file beside the node's data.
            agents.push(RunningAgent::start(&lan.nodes[node], NODE_NAMES[node], &args)?);
        }
        let mut cluster = Self {
            agents,
            store,
            pods: BTreeMap::new(),
            tally: Tally::default(),
            cgroup,
            lan,
            node_files,
            policies: BTreeSet::new(),
            dirty: false,
            base_pods: PodRef::all(),
            case: String::new(),
            changed_at: Instant::now(),
        };
        for (i, p) in PodRef::all().into_iter().enumerate() {
            cluster.add_pod(p, i % 2)?;
        }
        Ok(cluster)
    }

    /// ADDs pod `p` on `node`, starts its servers and writes its Pod object.
    pub fn add_pod(&mut self, p: PodRef, node: usize) -> anyhow::Result<()> {
        let pod = self.lan.add_k8s_pod(node, p.ns, p.name)?;
        let index = self.lan.nodes[node].pods.len() - 1;
        // The tag is the pod's name: a probe checks who answered. Leaked: nine short strings a run.
        let tag: &'static str = Box::leak(p.to_string().into_boxed_str());
        let servers = [Tagged::on_ports(&pod.netns, tag, 80, 80), Tagged::on_ports(&pod.netns, tag, 81, 81)];
        self.pods.insert(p, ServedPod { pod, node, index, _servers: servers });
        self.put_pod(p, &[]);
        Ok(())
    }

    /// DEL of pod `p` and its Pod object deleted.
    pub fn remove_pod(&mut self, p: PodRef) -> anyhow::Result<()> {
        let served = self.pods.remove(&p).ok_or_else(|| anyhow::anyhow!("no pod {p}"))?;
        self.store.delete(PODS, &p.to_string());
        self.lan.del_pod(served.node, served.index)
    }

    fn put_pod(&mut self, p: PodRef, extra_labels: &[(&str, &str)]) {
        let served = &self.pods[&p];
        let addresses: Vec<IpAddr> =
            [Some(served.pod.ip.into()), served.pod.ip6.map(IpAddr::from)].into_iter().flatten().collect();
        self.store.put(PODS, [objects::pod(p, NODE_NAMES[served.node], &addresses, extra_labels)]);
        self.changed_at = Instant::now();
    }

    /// Pod `p` relabelled: `pod: <name>` and `extra` (put back after the case).
    pub fn set_pod_labels(&mut self, p: PodRef, extra: &[(&str, &str)]) {
        self.dirty = true;
        self.put_pod(p, extra);
    }

    /// Namespace `ns` relabelled: its usual labels and `extra` (put back after the case).
    pub fn set_namespace_labels(&mut self, ns: &str, extra: &[(&str, &str)]) {
        self.dirty = true;
        self.store.put(NAMESPACES_PATH, [objects::namespace(ns, extra)]);
        self.changed_at = Instant::now();
    }

    /// The NetworkPolicies in the store become exactly `policies`.
    pub fn apply(&mut self, policies: Vec<Value>) {
        let names: BTreeSet<String> = policies
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap_or(""),
                    p["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect();
        for gone in self.policies.difference(&names) {
            self.store.delete(NETWORK_POLICIES, gone);
        }
        if !policies.is_empty() {
            self.store.put(NETWORK_POLICIES, policies);
        }
        self.policies = names;
        self.changed_at = Instant::now();
    }

    /// Adds (or replaces) policies, keeping the others.
    pub fn put_policies(&mut self, policies: Vec<Value>) {
        for p in &policies {
            self.policies.insert(format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or("")
            ));
        }
        self.store.put(NETWORK_POLICIES, policies);
        self.changed_at = Instant::now();
    }

    /// Deletes one policy (`ns/name`).
    pub fn delete_policy(&mut self, namespaced_name: &str) {
        self.store.delete(NETWORK_POLICIES, namespaced_name);
        self.policies.remove(namespaced_name);
        self.changed_at = Instant::now();
    }

    /// The pods of the base matrix and any a case added, in the matrix's order.
    pub fn pod_refs(&self) -> Vec<PodRef> {
        self.pods.keys().copied().collect()
    }

    /// Runs case `name`: no policy and the base labels and pods first, then `run`; a panic
    /// in it fails the case, not the file (the next case runs).
    pub fn case(&mut self, name: &str, run: impl FnOnce(&mut Self)) {
        self.reset();
        self.case = name.to_string();
        self.tally.cases += 1;
        println!("== case {}: {name}", self.tally.cases);
        let started = Instant::now();
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| run(self))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            self.tally.failed.push(format!("{name}: {why}"));
        }
        println!("   case took {:.1} s", started.elapsed().as_secs_f64());
    }

    /// Back to no policy, the base labels and the nine pods.
    fn reset(&mut self) {
        self.apply(Vec::new());
        if self.dirty {
            let added: Vec<PodRef> = self.pod_refs().into_iter().filter(|p| !self.base_pods.contains(p)).collect();
            for p in added {
                if let Err(e) = self.remove_pod(p) {
                    self.tally.failed.push(format!("removing {p}: {e:#}"));
                }
            }
            self.store.put(NAMESPACES_PATH, NAMESPACES.iter().map(|ns| objects::namespace(ns, &[])));
            for p in self.pod_refs() {
                self.put_pod(p, &[]);
            }
            self.dirty = false;
        }
    }

    /// Marks that the running case changed pods, so the next starts from the base again.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Probes the whole matrix over `family` until it is `expected` or [`SETTLE`] has passed
    /// since the last change; the last round counts. On a mismatch the tables are printed and
    /// the case is marked failed. Whether it matched.
    pub fn check(&mut self, family: Family, expected: &Reachability) -> bool {
        self.check_within(family, expected, SETTLE)
    }

    /// Like [`Self::check`] with its own deadline after the last change.
    pub fn check_within(&mut self, family: Family, expected: &Reachability, settle: Duration) -> bool {
        let deadline = self.changed_at + settle;
        loop {
            let (observed, reasons) = self.probe_matrix(family, expected);
            let wrong = table::wrong_cells(expected, &observed);
            if wrong.is_empty() {
                let took = self.changed_at.elapsed();
                self.tally.probes += expected.cells.len();
                self.tally.timings.push(format!(
                    "{} ({family}): as expected {} ms after the change",
                    self.case,
                    took.as_millis()
                ));
                println!(
                    "   {family}: {} probes as expected ({} ms after the change)",
                    expected.cells.len(),
                    took.as_millis()
                );
                return true;
            }
            if Instant::now() >= deadline {
                self.tally.probes += expected.cells.len();
                self.tally.wrong += wrong.len();
                println!(
                    "   {family}: {} of {} probes WRONG in case {:?}",
                    wrong.len(),
                    expected.cells.len(),
                    self.case
                );
                println!("{}", table::render(expected, &observed));
                // The first few, with why a probe that should have connected did not.
                for cell in wrong.iter().take(24) {
                    println!("     {cell} {}", reasons.get(cell).map_or(String::new(), |why| format!("({why})")));
                }
                self.tally.failed.push(format!(
                    "{} ({family}): {} of {} probes wrong",
                    self.case,
                    wrong.len(),
                    expected.cells.len()
                ));
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One round: every cell of `expected` probed at once; a probe expected to connect that did
    /// not is tried once more. The observed matrix, and why each failed probe failed (keyed
    /// like [`table::wrong_cells`]' lines).
    pub fn probe_matrix(&self, family: Family, expected: &Reachability) -> (Reachability, BTreeMap<String, String>) {
        let probes: Vec<((PodRef, PodRef, super::model::Target), bool, Probe)> = expected
            .cells
            .iter()
            .filter_map(|(&(from, to, target), &want)| {
                let (src, dst) = (self.pods.get(&from)?, self.pods.get(&to)?);
                let probe =
                    Probe { from_netns: src.pod.netns.clone(), to: dst.ip(family), target, tag: to.to_string() };
                Some(((from, to, target), want, probe))
            })
            .collect();
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = probes
                .iter()
                .map(|(_, want, probe)| {
                    scope.spawn(move || {
                        let first = probe_once(probe, PROBE_TIMEOUT);
                        if first.is_err() && *want { probe_once(probe, RETRY_TIMEOUT) } else { first }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("probe panicked".into()))).collect()
        });
        let mut observed = expected.clone();
        let mut reasons = BTreeMap::new();
        for ((key, want, _), result) in probes.iter().zip(results) {
            observed.cells.insert(*key, result.is_ok());
            if let Err(why) = result {
                let (from, to, target) = key;
                reasons.insert(
                    format!("{from} → {to} {target}: expected {}", if *want { "allowed" } else { "denied" }),
                    why,
                );
            }
        }
        (observed, reasons)
    }

    /// How long after the last change one probe (`from` → `to` on `target`) first gave
    /// `want`, probing every few milliseconds with a short timeout; `None` if not within `limit`.
    pub fn time_until(
        &self,
        from: PodRef,
        to: PodRef,
        target: super::model::Target,
        want: bool,
        limit: Duration,
    ) -> Option<Duration> {
        let probe = Probe {
            from_netns: self.pods[&from].pod.netns.clone(),
            to: self.pods[&to].ip(Family::V4),
            target,
            tag: to.to_string(),
        };
        loop {
            let got = std::thread::scope(|s| s.spawn(|| probe_once(&probe, Duration::from_millis(100))).join())
                .is_ok_and(|r| r.is_ok());
            let at = self.changed_at.elapsed();
            if got == want {
                return Some(at);
            }
            if at > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether every agent still runs (bad input must not end one).
    pub fn agents_alive(&mut self) -> bool {
        self.agents.iter_mut().all(|a| a.child.try_wait().is_ok_and(|status| status.is_none()))
    }

    /// Prints the summary line and every failure; panics if any case failed.
    pub fn finish(self) {
        for line in &self.tally.timings {
            println!("   {line}");
        }
        println!("{}", self.tally.summary());
        let log: Vec<String> = self.agents.iter().map(RunningAgent::log).collect();
        if log.iter().any(|l| l.contains("panicked")) {
            panic!("an agent panicked:\n{}", log.join("\n---\n"));
        }
        assert!(
            self.tally.failed.is_empty(),
            "failed:\n  {}\n{}",
            self.tally.failed.join("\n  "),
            self.tally.summary()
        );
    }
}

/// The node file of `node`: its network is the primary one (what the agent enforces policy
/// on), with the LAN's settings; root's, mode 0644, as the plugin and agent want it.
fn node_file(lan: &Lan, node: usize, options: Options, cgroup: Option<&TestCgroup>) -> anyhow::Result<PathBuf> {
    let tb = &lan.nodes[node];
    let path = tb.data_dir().with_file_name("node.json");
    let mut conf = json!({
        "primaryNetwork": tb.network, "ipMasq": true,
        "clusterCIDR": format!("{},{}", options.cluster_cidr, options.ipv6.cluster_cidr),
        "podCIDRs": [tb.subnet, options.ipv6.subnets[node]],
        "bpffsRoot": tb.bpffs_root(), "ipamDataDir": tb.data_dir(),
    });
    if let Some(cgroup) = cgroup {
        conf["kubeProxyReplacement"] = json!(true);
        conf["cgroupRoot"] = json!(cgroup.path());
    }
    std::fs::write(&path, conf.to_string())?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    Ok(path)
}

/// Node `node` with its addresses. Without its pod CIDRs: the LAN has made the routes to the
/// other node's pods already, and the agent would only report them as not its own.
fn node_object(node: usize) -> Value {
    json!({ "metadata": { "name": NODE_NAMES[node] },
            "status": { "addresses": [{ "type": "InternalIP", "address": LAN_NODE_IPS[node] },
                                      { "type": "InternalIP", "address": LAN_NODE_IPV6S[node] }] } })
}
