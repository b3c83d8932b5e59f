//! Many verbs at once, as kubelet sends them when a node with pending pods becomes ready or is
//! drained, and what each left once the runtime's follow-up (if any) is done.
use std::{collections::HashSet, net::Ipv4Addr};

use anyhow::Result;
use serde_json::Value;

use super::faults::Killer;
use crate::{CniOutput, Testbed};

/// Runs `verb` for every pod in `pods` at the same time, one thread per call.
pub fn all_at_once(tb: &Testbed, verb: &str, pods: &[usize], conf: &Value) -> Result<Vec<CniOutput>> {
    std::thread::scope(|scope| {
        let calls: Vec<_> = pods.iter().map(|pod| scope.spawn(move || tb.cni(verb, *pod, conf))).collect();
        calls.into_iter().map(|call| call.join().expect("a CNI call's thread panicked")).collect()
    })
}

/// The pod's first IPv4 address in an ADD's result.
pub fn address(out: &CniOutput) -> Option<Ipv4Addr> {
    let cidr = out.json()["ips"][0]["address"].as_str()?.to_string();
    cidr.split('/').next()?.parse().ok()
}

/// How many addresses appear more than once.
pub fn duplicates(addresses: impl IntoIterator<Item = Ipv4Addr>) -> usize {
    let mut seen = HashSet::new();
    addresses.into_iter().filter(|a| !seen.insert(*a)).count()
}

/// Where a pod stands after a verb and the runtime's follow-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    /// ADD succeeded: a valid attachment with this address.
    Added(Ipv4Addr),
    /// Nothing of it is left (DEL succeeded, or DEL followed a killed verb); its sandbox is clean.
    Deleted,
    /// Killed and forgotten by the runtime: what it left is GC's, its sandbox is not reusable.
    Forgotten,
    /// A verb that should have worked did not (a bug): what it said.
    Failed(String),
}

/// A verb's own output (the follow-up's is not kept) and where it left the pod.
pub struct Outcome {
    pub pod: usize,
    pub out: CniOutput,
    pub after: After,
}

impl Outcome {
    /// Whether the verb ran to its end (its peak RSS and fd count are a whole verb's).
    pub fn ran_whole(&self) -> bool {
        self.out.killed_by.is_none()
    }
}

/// Runs `verb` for `pod` through `killer` with the variables `more`, then what a runtime does
/// after a kill (DEL, or nothing).
pub fn verb_and_follow_up(
    tb: &Testbed,
    killer: &Killer,
    verb: &str,
    pod: usize,
    conf: &Value,
    more: &[(&str, &str)],
) -> Result<Outcome> {
    let out = killer.run(tb, verb, pod, conf, more)?;
    let after = if out.killed_by == Some(libc::SIGKILL) {
        if killer.follow_up() {
            let del = tb.cni("DEL", pod, conf)?;
            if del.success { After::Deleted } else { failed("DEL after a killed ".to_string() + verb, &del) }
        } else {
            After::Forgotten
        }
    } else {
        match (verb, out.success, address(&out)) {
            ("ADD", true, Some(ip)) => After::Added(ip),
            ("DEL", true, _) => After::Deleted,
            _ => failed(verb.to_string(), &out),
        }
    };
    Ok(Outcome { pod, out, after })
}

fn failed(what: String, out: &CniOutput) -> After {
    After::Failed(format!("{what}: {} {}", out.stdout.trim(), out.stderr.trim()))
}

/// [`verb_and_follow_up`] for every pod in `pods`, at most `width` at a time.
pub fn in_waves(
    tb: &Testbed,
    killer: &Killer,
    verb: &str,
    pods: &[usize],
    conf: &Value,
    more: &[(&str, &str)],
    width: usize,
) -> Result<Vec<Outcome>> {
    let mut after = Vec::with_capacity(pods.len());
    for wave in pods.chunks(width.max(1)) {
        let outcomes: Vec<Result<Outcome>> = std::thread::scope(|scope| {
            let calls: Vec<_> = wave
                .iter()
                .map(|pod| scope.spawn(move || verb_and_follow_up(tb, killer, verb, *pod, conf, more)))
                .collect();
            calls.into_iter().map(|call| call.join().expect("a CNI call's thread panicked")).collect()
        });
        for outcome in outcomes {
            after.push(outcome?);
        }
    }
    Ok(after)
}
