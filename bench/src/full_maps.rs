//! Control plane with full flow maps (issue 24, item 9), ebpf-cni only: bridge keeps no such
//! maps (conntrack holds its flows, and DEL never walks it). One masquerading node with a few
//! pods, measured twice: with `NAT` and `FLOWS` as the pods leave them (empty: nothing sent), then
//! with both filled to capacity from userspace through their pins (65,536 and 131,072 entries of
//! distinct flows, owned by the node's pods and by owners gone long ago), once, untimed. At each
//! level, per round: DEL's wall time, one pod after the other (a batch added, then deleted), and
//! the wall time of one ADD started while 8 DELs run at once, as when a deployment scales down
//! while another scales up. A DEL that purges the deleted pod's flows walks both maps whole while
//! it holds the node's lock, and every ADD and DEL of the node waits meanwhile.
use anyhow::{Context, Result, ensure};
use aya::maps::{HashMap, Map, MapData};
use ebpf_cni_tests::{Plugin, Testbed};
use ebpf_common::{
    Endpoint, FAMILY_IPV4, FLOW_VIA_STACK, FLOWS_MAX_ENTRIES, FlowEntry, FlowKey, IpKey, NAT_EGRESS, NAT_MAX_ENTRIES,
    NAT_REPLY, NatEntry, ipv4_in_16, names,
};

use crate::{
    Settings,
    control::Node,
    report::{Better::*, Figure},
    stats::Samples,
    topology::Path,
};

const SECTION: &str = "control plane, full flow maps (ebpf-cni only)";

/// DELs running when the ADD starts.
const CONCURRENT_DELS: usize = 8;

/// ADDs started behind DELs per round and level: a round's value is their median.
const CONTENDED_PER_ROUND: usize = 3;

/// Owners that hold no endpoint: pods deleted long ago whose flows still age in the maps.
const GONE_OWNERS: u64 = 1_000;

pub fn run(s: &Settings, ours: &Plugin) -> Result<Vec<Figure>> {
    let mut node = Node::new(Path::EbpfCni, ours)?;
    // Pods that stay on the node: the owners of the live flows.
    let resident = s.batch;
    for _ in 0..resident {
        node.add()?;
    }
    let mut figures = Vec::new();
    let mut del_p50 = Vec::new();
    for full in [false, true] {
        let maps = if full { "full NAT and FLOWS maps" } else { "empty NAT and FLOWS maps" };
        if full {
            let (nat, flows) = fill(node.testbed())?;
            eprintln!("control full maps: filled NAT with {nat} and FLOWS with {flows} entries");
        }
        let mut alone = Figure::new(SECTION, format!("ADD p50, no DEL running, {maps}, {resident} pods"), "ms", Lower);
        let mut del = Figure::new(SECTION, format!("DEL p50, {maps}, {resident} pods"), "ms", Lower);
        let mut del99 = Figure::new(SECTION, format!("DEL p99, {maps}, {resident} pods"), "ms", Lower).pooled_p99();
        let mut add =
            Figure::new(SECTION, format!("ADD started behind {CONCURRENT_DELS} concurrent DELs, {maps}"), "ms", Lower);
        if full {
            add = add.target(None, 100.0);
        }
        let mut slowest =
            Figure::new(SECTION, format!("slowest of the {CONCURRENT_DELS} concurrent DELs, {maps}"), "ms", Lower);
        let mut ahead = Figure::new(SECTION, format!("concurrent DELs ended before that ADD, {maps}"), "DELs", Lower);
        for round in 0..s.rounds {
            crate::cpu::wait_idle()?;
            let (mut adds, mut batch) = (Samples::default(), Vec::new());
            for _ in 0..s.batch {
                let (pod, ms) = node.add()?;
                batch.push(pod);
                adds.push(ms);
            }
            let mut dels = Samples::default();
            for pod in batch {
                dels.push(node.del(pod)?);
            }
            crate::cpu::wait_idle()?;
            let (mut behind, mut slow, mut first) = (Samples::default(), Samples::default(), Samples::default());
            for _ in 0..CONTENDED_PER_ROUND {
                let mut going = Vec::new();
                for _ in 0..CONCURRENT_DELS {
                    going.push(node.add()?.0);
                }
                let contended = node.add_behind_dels(&going)?;
                node.del(contended.pod)?;
                behind.push(contended.add_ms);
                slow.push(contended.dels_ms.iter().copied().fold(0.0, f64::max));
                first.push(contended.dels_ended_first as f64);
            }
            eprintln!(
                "control {maps} round {round}: ADD p50 {:.1} ms, DEL p50 {:.1} ms; ADD behind {CONCURRENT_DELS} \
                 DELs p50 {:.1} ms (slowest DEL {:.1} ms, {} DELs ended first)",
                adds.median(),
                dels.median(),
                behind.median(),
                slow.median(),
                first.median()
            );
            alone.record(Path::EbpfCni, adds.median());
            del.record(Path::EbpfCni, dels.median());
            del99.record_round(Path::EbpfCni, &dels);
            add.record(Path::EbpfCni, behind.median());
            slowest.record(Path::EbpfCni, slow.median());
            ahead.record(Path::EbpfCni, first.median());
        }
        del_p50.push(del.median(Path::EbpfCni).unwrap_or(f64::NAN));
        figures.extend([alone, del, del99, add, slowest, ahead]);
        if full {
            // What the DELs were measured against: the maps as the last round left them.
            let (nat, flows) = entries(node.testbed())?;
            for (name, capacity, count) in
                [(names::NAT, NAT_MAX_ENTRIES, nat), (names::FLOWS, FLOWS_MAX_ENTRIES, flows)]
            {
                let mut held =
                    Figure::new(SECTION, format!("{name} entries after the rounds (of {capacity})"), "entries", Higher);
                held.record(Path::EbpfCni, count as f64);
                figures.push(held);
            }
        }
    }
    let mut ratio =
        Figure::new(SECTION, "DEL p50 with full ÷ with empty NAT and FLOWS maps", "×", Lower).target(None, 1.2);
    ratio.record(Path::EbpfCni, del_p50[1] / del_p50[0]);
    figures.push(ratio);
    Ok(figures)
}

/// Fills the pinned `NAT` and `FLOWS` maps to capacity with flows of distinct keys: half of them
/// owned by the node's pods (in turn), half by [`GONE_OWNERS`] owners without an endpoint. Only
/// the maps every release pins: nothing here depends on `FEATURES`. Returns how many entries
/// each map holds afterwards (an LRU map may have evicted a few while others were free).
fn fill(tb: &Testbed) -> Result<(usize, usize)> {
    let endpoints = MapData::from_pin(tb.map_pin(names::ENDPOINTS)).context("opening pinned ENDPOINTS")?;
    let endpoints: HashMap<_, IpKey, Endpoint> = HashMap::try_from(Map::from_map_data(endpoints)?)?;
    let mut live: Vec<u64> = endpoints.iter().filter_map(Result::ok).map(|(_, e)| e.owner).collect();
    live.sort_unstable();
    live.dedup();
    ensure!(!live.is_empty(), "no pod on the node");
    let owner = |i: u32| match i % 2 {
        0 => live[(i as usize / 2) % live.len()],
        _ => 0x0ec0_dead_0000_0000 | (u64::from(i / 2) % GONE_OWNERS),
    };
    // Flow i: pod 10.244.0.0/16 address and port → an outside address that encodes i.
    let key = |i: u32, protocol: u8| FlowKey {
        family: FAMILY_IPV4,
        protocol,
        pad: [0; 2],
        src_port: 32_768 + (i % 28_000) as u16,
        dst_port: 443,
        src_addr: ipv4_in_16([10, 244, (i >> 8) as u8, i as u8]),
        dst_addr: ipv4_in_16([100, (i >> 16) as u8, (i >> 8) as u8, i as u8]),
    };
    // Neither build's DEL looks at an entry's age: 0 (never seen) is as good as any.
    let mut nat = flow_map::<NatEntry>(tb, names::NAT)?;
    for i in 0..NAT_MAX_ENTRIES {
        let direction = if i % 2 == 0 { NAT_EGRESS } else { NAT_REPLY };
        let entry = NatEntry {
            addr: ipv4_in_16([192, 0, 2, 1]),
            port: 20_000 + (i % 40_000) as u16,
            direction,
            closing: 0,
            pad: [0; 4],
            owner: owner(i),
            last_seen_ns: 0,
        };
        nat.insert(key(i, 6), entry, 0).with_context(|| format!("NAT entry {i}"))?;
    }
    let mut flows = flow_map::<FlowEntry>(tb, names::FLOWS)?;
    for i in 0..FLOWS_MAX_ENTRIES {
        let entry = FlowEntry { owner: owner(i), last_seen_ns: 0, flags: FLOW_VIA_STACK, pad: 0 };
        flows.insert(key(i, 17), entry, 0).with_context(|| format!("FLOWS entry {i}"))?;
    }
    entries(tb)
}

/// How many entries the pinned `NAT` and `FLOWS` maps hold.
fn entries(tb: &Testbed) -> Result<(usize, usize)> {
    let nat = flow_map::<NatEntry>(tb, names::NAT)?.keys().count();
    Ok((nat, flow_map::<FlowEntry>(tb, names::FLOWS)?.keys().count()))
}

/// The node's pinned `NAT` or `FLOWS` map (LRU hash maps keyed by [`FlowKey`]).
fn flow_map<V: aya::Pod>(tb: &Testbed, name: &str) -> Result<HashMap<MapData, FlowKey, V>> {
    let data = MapData::from_pin(tb.map_pin(name)).with_context(|| format!("opening pinned {name}"))?;
    Ok(HashMap::try_from(Map::from_map_data(data)?)?)
}
