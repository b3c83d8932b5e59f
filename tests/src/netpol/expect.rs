//! The expected matrix, built by hand per case the way upstream's tests build theirs: start from
//! all allowed (or all denied) and state the exceptions by peer. A pod's traffic to itself never
//! leaves it (loopback), so the diagonal is not part of the matrix.
use std::collections::BTreeMap;

use super::model::{ALL_TARGETS, PodRef, Target};

/// Some pods: all of them, one namespace's, or one pod.
#[derive(Clone, Copy, Debug, Default)]
pub struct Peer {
    pub ns: Option<&'static str>,
    pub pod: Option<&'static str>,
}

impl Peer {
    pub const ANY: Self = Self { ns: None, pod: None };

    pub const fn ns(ns: &'static str) -> Self {
        Self { ns: Some(ns), pod: None }
    }

    pub const fn pod(ns: &'static str, pod: &'static str) -> Self {
        Self { ns: Some(ns), pod: Some(pod) }
    }

    /// Pods named `pod` in every namespace.
    pub const fn named(pod: &'static str) -> Self {
        Self { ns: None, pod: Some(pod) }
    }

    pub fn matches(&self, p: PodRef) -> bool {
        self.ns.is_none_or(|ns| ns == p.ns) && self.pod.is_none_or(|name| name == p.name)
    }
}

/// Whether each (from, to, target) is expected to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reachability {
    pub pods: Vec<PodRef>,
    pub cells: BTreeMap<(PodRef, PodRef, Target), bool>,
}

impl Reachability {
    /// Every pair on every target `allowed`.
    pub fn all(allowed: bool) -> Self {
        Self::all_among(PodRef::all(), allowed)
    }

    /// Like [`Self::all`] over `pods` (a case with a tenth pod).
    pub fn all_among(pods: Vec<PodRef>, allowed: bool) -> Self {
        let mut cells = BTreeMap::new();
        for &from in &pods {
            for &to in pods.iter().filter(|&&to| to != from) {
                for target in ALL_TARGETS {
                    cells.insert((from, to, target), allowed);
                }
            }
        }
        Self { pods, cells }
    }

    /// From `from` to `to`, on every target.
    pub fn expect(self, from: Peer, to: Peer, allowed: bool) -> Self {
        self.expect_on(from, to, &ALL_TARGETS, allowed)
    }

    /// From `from` to `to`, on `targets` only.
    pub fn expect_on(mut self, from: Peer, to: Peer, targets: &[Target], allowed: bool) -> Self {
        for ((f, t, target), cell) in &mut self.cells {
            if from.matches(*f) && to.matches(*t) && targets.contains(target) {
                *cell = allowed;
            }
        }
        self
    }

    /// Everything into `to` (upstream's `ExpectAllIngress`).
    pub fn all_ingress(self, to: Peer, allowed: bool) -> Self {
        self.expect(Peer::ANY, to, allowed)
    }

    /// Everything out of `from` (upstream's `ExpectAllEgress`).
    pub fn all_egress(self, from: Peer, allowed: bool) -> Self {
        self.expect(from, Peer::ANY, allowed)
    }

    pub fn deny_to(self, to: Peer) -> Self {
        self.all_ingress(to, false)
    }

    pub fn deny_from(self, from: Peer) -> Self {
        self.all_egress(from, false)
    }

    pub fn allow(self, from: Peer, to: Peer) -> Self {
        self.expect(from, to, true)
    }

    /// From every pod of namespace `ns` into `to`.
    pub fn allow_from_ns(self, ns: &'static str, to: Peer) -> Self {
        self.expect(Peer::ns(ns), to, true)
    }

    pub fn get(&self, from: PodRef, to: PodRef, target: Target) -> Option<bool> {
        self.cells.get(&(from, to, target)).copied()
    }

    /// The targets the matrix holds, in order.
    pub fn targets(&self) -> Vec<Target> {
        let mut targets: Vec<Target> = self.cells.keys().map(|(_, _, t)| *t).collect();
        targets.sort();
        targets.dedup();
        targets
    }
}
