//! Churn: pods come and go in rounds of `batch` at once, each ADD and DEL maybe killed (see
//! [`Killer`]), each pod sending one masqueraded datagram while it lives (so that DEL has NAT
//! entries to remove). Pods the runtime forgot after a kill keep their sandboxes until the
//! caller's GC; their slots get new ones.
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::Result;

use super::{
    faults::Killer,
    memory::Series,
    waves::{After, Outcome, duplicates, in_waves},
};
use crate::{Testbed, traffic};

pub struct ChurnPlan {
    /// ADD/DEL cycles in all (rounded up to whole rounds).
    pub cycles: usize,
    /// Pods added (then deleted) at once per round.
    pub batch: usize,
    /// Where each new pod sends a datagram, if anywhere.
    pub masq_to: Option<SocketAddrV4>,
    /// Ask each verb for its open descriptors at exit (debug builds).
    pub report_fds: bool,
}

#[derive(Default)]
pub struct ChurnOutcome {
    pub cycles: usize,
    /// Peak RSS of each verb that ran whole, by cycle.
    pub plugin_rss: Series,
    /// Descriptors open at exit of each verb that ran whole (with `report_fds`).
    pub fds: Vec<usize>,
    /// Addresses given to two pods that lived at the same time (or to a resident pod).
    pub duplicates: usize,
    /// Verbs that failed without being killed, and why.
    pub failures: Vec<String>,
}

/// Runs `plan` on `tb` next to the `resident` pods' addresses; `each_round(tb, cycles done)`
/// runs while a round's pods are up.
pub fn churn(
    tb: &mut Testbed,
    killer: &Killer,
    plan: &ChurnPlan,
    resident: &[Ipv4Addr],
    mut each_round: impl FnMut(&Testbed, usize) -> Result<()>,
) -> Result<ChurnOutcome> {
    let more: &[(&str, &str)] = if plan.report_fds { &[("EBPF_CNI_REPORT_FDS", "1")] } else { &[] };
    let mut slots: Vec<usize> = (0..plan.batch).map(|_| tb.new_pod()).collect::<Result<_>>()?;
    let mut outcome = ChurnOutcome::default();
    let conf = tb.conf("1.1.0");
    for round in 0..plan.cycles.div_ceil(plan.batch) {
        let first_cycle = round * plan.batch;
        // New pods in the same sandboxes: a new container ID each round.
        for slot in &slots {
            tb.pods[*slot].container_id = format!("{}-c{slot}-r{round}", tb.run_id);
        }
        let added = in_waves(tb, killer, "ADD", &slots, &conf, more, plan.batch)?;
        let mut up = Vec::new();
        for outcome_of in &added {
            if let After::Added(ip) = outcome_of.after {
                up.push((outcome_of.pod, ip));
                if let Some(to) = plan.masq_to {
                    let netns = &tb.pods[outcome_of.pod].netns.name;
                    let client = traffic::udp_socket(netns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
                    client.send_to(b"x", to)?;
                }
            }
        }
        outcome.duplicates += duplicates(resident.iter().copied().chain(up.iter().map(|(_, ip)| *ip)));
        each_round(tb, first_cycle + plan.batch)?;
        let leaving: Vec<usize> = up.iter().map(|(pod, _)| *pod).collect();
        let deleted = in_waves(tb, killer, "DEL", &leaving, &conf, more, plan.batch)?;
        for (verbs, cycle_base) in [(&added, first_cycle), (&deleted, first_cycle)] {
            record(&mut outcome, verbs, &slots, cycle_base);
        }
        // A sandbox a killed verb may have left an interface in is not used again.
        for done in added.iter().chain(&deleted) {
            if matches!(done.after, After::Forgotten | After::Failed(_)) {
                let slot = slots.iter().position(|s| *s == done.pod).expect("a slot's pod");
                slots[slot] = tb.new_pod()?;
            }
        }
        outcome.cycles = first_cycle + plan.batch;
    }
    Ok(outcome)
}

/// Figures of a round's verbs: the cycle of a verb is its round's first plus its slot.
fn record(outcome: &mut ChurnOutcome, verbs: &[Outcome], slots: &[usize], first_cycle: usize) {
    for verb in verbs {
        if let After::Failed(why) = &verb.after {
            outcome.failures.push(why.clone());
        }
        if !verb.ran_whole() {
            continue;
        }
        let slot = slots.iter().position(|s| *s == verb.pod).unwrap_or(0);
        outcome.plugin_rss.push(first_cycle + slot, verb.out.peak_rss_kib);
        if let Some(fds) = fds_at_exit(&verb.out.stderr) {
            outcome.fds.push(fds);
        }
    }
}

/// `ebpf-cni: open fds at exit: N` (a debug build's report with `EBPF_CNI_REPORT_FDS`).
pub fn fds_at_exit(stderr: &str) -> Option<usize> {
    stderr.lines().find_map(|l| l.strip_prefix("ebpf-cni: open fds at exit: "))?.trim().parse().ok()
}
