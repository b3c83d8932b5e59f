//! NetworkPolicy enforcement: the agent watches NetworkPolicies, Pods and Namespaces, compiles
//! them (`policy/`) with this node's pods in `ENDPOINTS`, and writes what changed into the
//! primary network's policy maps. Nothing is written before all three first lists came: until
//! then every pod is not isolated (allowed), as with no policy, rather than judged on half the
//! cluster. A burst of events is one compile.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::PathBuf,
    sync::{
        Arc,
        mpsc::{Receiver, RecvTimeoutError, Sender, channel},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::NetworkPolicy,
};

use super::{
    policy_sink::{PolicySink, Written},
    policy_stats::{PolicyStats, Sizes},
};
use crate::{
    bpf::policy_maps,
    kube::{Feed, Update},
    policy::{self, Compiled, Compiler, Local},
};

pub enum Input {
    Policies(Box<Update<NetworkPolicy>>),
    Pods(Box<Update<Pod>>),
    Namespaces(Box<Update<Namespace>>),
    /// This node's addresses (its Node's InternalIPs): `IDENTITY_HOST`.
    NodeAddrs(Vec<IpAddr>),
}

/// How often, with no event, the node's pods in `ENDPOINTS` and the maps' pins are checked: an
/// ADD's pod becomes a subject when both the API (its address) and `ENDPOINTS` know it.
const RECHECK: Duration = Duration::from_millis(500);

/// Adds the three watches to `feed` and starts the policy thread; its input.
/// `root` and `network`: the primary network's pins, whose maps the policies go into.
pub fn start(
    feed: &mut Feed,
    root: PathBuf,
    network: String,
    names: PathBuf,
    stats: Arc<PolicyStats>,
) -> Sender<Input> {
    let (tx, rx) = channel();
    feed.watch(tx.clone(), |update| Input::Policies(Box::new(update)));
    feed.watch(tx.clone(), |update| Input::Pods(Box::new(update)));
    feed.watch(tx.clone(), |update| Input::Namespaces(Box::new(update)));
    std::thread::spawn(move || {
        let sink = PolicySink::new(&root, &network);
        stats.started(Some(sink.pins().clone()));
        Thread::new(sink, names, stats).run(&rx);
    });
    tx
}

struct Thread {
    model: policy::Input,
    /// Node addresses from the API; the datapath's own are added at each compile.
    api_node_addrs: BTreeSet<IpAddr>,
    compiler: Compiler,
    sink: PolicySink,
    names_path: PathBuf,
    stats: Arc<PolicyStats>,
    listed: [bool; 3],
    last: Compiled,
    names_written: Option<policy::Names>,
}

impl Thread {
    fn new(sink: PolicySink, names_path: PathBuf, stats: Arc<PolicyStats>) -> Self {
        let (model, compiler, last) = (policy::Input::default(), Compiler::default(), Compiled::default());
        let api_node_addrs = BTreeSet::new();
        Self { model, api_node_addrs, compiler, sink, names_path, stats, listed: [false; 3], last, names_written: None }
    }

    fn run(mut self, input: &Receiver<Input>) {
        let mut first_sync_logged = false;
        loop {
            let (taken, mut dirty) = match input.recv_timeout(RECHECK) {
                Ok(first) => {
                    let taken = Instant::now();
                    for update in std::iter::once(first).chain(input.try_iter()) {
                        self.take(update);
                    }
                    (taken, true)
                }
                Err(RecvTimeoutError::Timeout) => (Instant::now(), false),
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if self.listed != [true; 3] {
                continue;
            }
            // The node's pods, and the maps (a datapath loaded again has new, empty ones).
            let locals = self.locals();
            if locals != self.model.locals || self.sink.stale() {
                self.model.locals = locals;
                dirty = true;
            }
            if !dirty {
                continue;
            }
            let enforcing = self.sync();
            self.stats.synced(taken.elapsed(), enforcing);
            if !first_sync_logged {
                first_sync_logged = true;
                log::info!(
                    "network policy: first sync, {} policies, {} rules, {} local pods ({:?})",
                    self.last.policies,
                    self.last.rules.len(),
                    self.last.endpoints.len() + self.last.endpoints_by_ifindex.len(),
                    taken.elapsed()
                );
            }
        }
    }

    fn take(&mut self, update: Input) {
        let m = &mut self.model;
        match update {
            Input::Policies(u) => {
                self.listed[0] |= u.apply_to(
                    "networkpolicies",
                    m,
                    policy::Input::list_policies,
                    policy::Input::apply_policy,
                    policy::Input::delete_policy,
                )
            }
            Input::Pods(u) => {
                self.listed[1] |=
                    u.apply_to("pods", m, policy::Input::list_pods, policy::Input::apply_pod, policy::Input::delete_pod)
            }
            Input::Namespaces(u) => {
                self.listed[2] |= u.apply_to(
                    "namespaces",
                    m,
                    policy::Input::list_namespaces,
                    policy::Input::apply_namespace,
                    policy::Input::delete_namespace,
                )
            }
            Input::NodeAddrs(addrs) => self.api_node_addrs = addrs.into_iter().collect(),
        }
    }

    fn locals(&self) -> BTreeMap<IpAddr, Local> {
        // No datapath loaded (no pod yet, or between the last DEL and the reload): none.
        policy_maps::local_pods(self.sink.pins()).unwrap_or_default()
    }

    /// Compiles and writes; whether the maps are enforced.
    fn sync(&mut self) -> bool {
        let mut node_addrs = self.api_node_addrs.clone();
        node_addrs.extend(policy_maps::node_addrs(self.sink.pins()).unwrap_or_default());
        self.model.node_addrs = node_addrs;
        let compiled = self.compiler.compile(&self.model);
        if compiled.problems != self.last.problems {
            for problem in compiled.problems.iter().filter(|p| !self.last.problems.contains(p)) {
                log::warn!("network policy: {problem}");
            }
            self.stats.bad_input(compiled.problems.len());
        }
        for policy in compiled.unmatched.iter().filter(|p| !self.last.unmatched.contains(p)) {
            log::info!("network policy: {policy} selects no pod");
        }
        let new_slots = self.compiler.take_new_slots();
        self.stats.started(Some(self.sink.pins().clone()));
        let enforcing = match self.sink.write(&compiled, &new_slots) {
            Written::NotEnforced => false,
            Written::Applied { changes, applied, took } => {
                log::debug!("network policy: {changes} map changes in {took:?} ({} failed)", applied.failed);
                true
            }
        };
        if self.names_written.as_ref() != Some(&compiled.names) {
            match compiled.names.write(&self.names_path) {
                Ok(()) => self.names_written = Some(compiled.names.clone()),
                Err(e) => log::warn!("network policy: writing {}: {e}", self.names_path.display()),
            }
        }
        let sizes =
            Sizes { policies: compiled.policies, identities: compiled.identities.len(), rules: compiled.rules.len() };
        let slots = self.compiler.slots().map(|((ns, name), slot)| (slot, ns.clone(), name.clone())).collect();
        self.stats.sizes(sizes, slots);
        self.last = compiled;
        enforcing
    }
}
