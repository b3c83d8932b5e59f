//! One pod's share of masquerade is bounded (issue 24, item 4), attacked with crafted frames
//! through the pinned `to_uplink` of a live node:
//! - a sweep of one destination from one pod gets at most half of the port range, and its
//!   flows, refreshed, still count: another pod keeps finding ports there;
//! - a pod opening flows to ever new destinations stops at its total (`NAT_POD_MAX_FLOWS`), so
//!   it cannot fill `NAT` and have its LRU evict another pod's idle flow;
//! - GC's recount from `NAT` keeps the counts of live flows and forgets flows gone unseen (the
//!   agent recounts the same way every interval).
use std::net::Ipv4Addr;

use ebpf_cni_tests::{
    Attached, Cluster, EXT_SERVER, NODE1_UPLINK_IP, Testbed,
    frames::{ethernet, ipv4, tcp, with_checksums},
    prog_run::{TC_ACT_SHOT, TC_ACT_UNSPEC, run},
};
use ebpf_common::{DropReason, NAT_POD_MAX_FLOWS, per_destination_bound};
use serde_json::json;

const ETH_IPV4: u16 = 0x0800;
const UDP: u8 = 17;
const TCP: u8 = 6;

/// Pod `from`'s UDP datagram from `sport` to `to:dport` through `to_uplink`: the verdict and
/// the source it left with.
fn send(tb: &Testbed, from: &Attached, sport: u16, to: Ipv4Addr, dport: u16) -> (u32, Ipv4Addr, u16) {
    let l4 = [&sport.to_be_bytes()[..], &dport.to_be_bytes(), &[0, 9, 0, 0, b'x']].concat();
    frame_out(tb, [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(from.ip, to, UDP, &l4)].concat())
}

fn frame_out(tb: &Testbed, frame: Vec<u8>) -> (u32, Ipv4Addr, u16) {
    let (verdict, out) = run(tb, "to_uplink", "uplink0", with_checksums(frame));
    (verdict, Ipv4Addr::new(out[26], out[27], out[28], out[29]), u16::from_be_bytes([out[34], out[35]]))
}

/// Opens flows from pod `from` (source ports from `first_sport`) to `to` and destination ports
/// `dports`, until one is refused; returns how many got a port and the drop's verdict.
fn open_until_refused(tb: &Testbed, from: &Attached, to: Ipv4Addr, dports: impl Iterator<Item = u16>) -> (usize, u32) {
    let mut opened = 0;
    for (i, dport) in dports.enumerate() {
        let (verdict, _, _) = send(tb, from, 10_000 + (i % 50_000) as u16, to, dport);
        if verdict != TC_ACT_UNSPEC {
            return (opened, verdict);
        }
        opened += 1;
    }
    (opened, TC_ACT_UNSPEC)
}

fn cluster(test: &str, tag: &str, second_octet: u8) -> Option<Cluster> {
    let cidr = format!("10.{second_octet}.0.0/16");
    let subnets = [format!("10.{second_octet}.1.0/24"), format!("10.{second_octet}.2.0/24")];
    let mut c = Cluster::for_test(test, tag, &cidr, [subnets[0].as_str(), subnets[1].as_str()])?;
    c.nodes[0].extra.insert("masqPortRange".into(), json!("20000-20999"));
    Some(c)
}

#[test]
fn one_pod_cannot_hold_a_destinations_ports() {
    let Some(mut c) = cluster("one_pod_cannot_hold_a_destinations_ports", "share", 227) else { return };
    let tb = &mut c.nodes[0];
    let [a, b]: [Attached; 2] = tb.add_attachments(2).unwrap().try_into().unwrap();
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let bound = per_destination_bound(20_000, 20_999) as usize;

    // a sweeps ext:53 from one source port after another: it gets its share, then refusals.
    let before = tb.drops(DropReason::NatPodShare).unwrap();
    let (opened, verdict) = open_until_refused(tb, &a, ext, std::iter::repeat_n(53, 1_000));
    assert_eq!((opened, verdict), (bound, TC_ACT_SHOT), "a's sweep of ext:53 ({bound} allowed of 1,000 ports)");
    assert_eq!(tb.drops(DropReason::NatPodShare).unwrap(), before + 1, "the refusal is counted as nat-pod-share");
    // Refreshing its flows keeps them (they are live) and wins it nothing.
    for i in 0..10 {
        assert_eq!(send(tb, &a, 10_000 + i, ext, 53).0, TC_ACT_UNSPEC, "a's existing flow {i}");
    }
    assert_eq!(send(tb, &a, 19_999, ext, 53).0, TC_ACT_SHOT, "a new flow after the refresh");
    // The others still find ports there, and a other destinations.
    for i in 0..20 {
        let (verdict, source, _) = send(tb, &b, 30_000 + i, ext, 53);
        assert_eq!((verdict, source), (TC_ACT_UNSPEC, NODE1_UPLINK_IP.parse().unwrap()), "b's flow {i} to ext:53");
    }
    assert_eq!(send(tb, &a, 19_999, ext, 54).0, TC_ACT_UNSPEC, "a to another destination");

    // GC's recount from NAT keeps the live flows' counts: still refused.
    tb.gc(&[0, 1]).unwrap();
    assert_eq!(send(tb, &a, 19_998, ext, 53).0, TC_ACT_SHOT, "a new flow after GC's recount");

    // Flows that leave NAT unseen (the LRU drops them) stop counting at the next recount.
    forget_all_flows(tb);
    tb.gc(&[0, 1]).unwrap();
    assert_eq!(send(tb, &a, 19_998, ext, 53).0, TC_ACT_UNSPEC, "a's new flow once its old ones are gone");
}

#[test]
fn connections_a_pod_closes_leave_its_share() {
    let Some(mut c) = cluster("connections_a_pod_closes_leave_its_share", "sharefin", 230) else { return };
    let tb = &mut c.nodes[0];
    let [a]: [Attached; 1] = tb.add_attachments(1).unwrap().try_into().unwrap();
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();
    let bound = per_destination_bound(20_000, 20_999);
    let segment = |sport: u16, flags: u8| {
        frame_out(tb, [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(a.ip, ext, TCP, &tcp(sport, 443, flags))].concat()).0
    };
    // A client that opens and closes connection after connection (no keep-alive) never runs into
    // its share: only the connections it holds open count (more than the share here, fewer than
    // the range holds while closed connections keep their ports for 10 s).
    for i in 0..(bound as u16 + bound as u16 / 4) {
        assert_eq!(segment(10_000 + i, 0x02), TC_ACT_UNSPEC, "a's SYN {i}");
        assert_eq!(segment(10_000 + i, 0x11), TC_ACT_UNSPEC, "a's FIN {i}");
    }
}

/// Empties `NAT`, as an LRU that needed the room would.
fn forget_all_flows(tb: &Testbed) {
    use aya::maps::{HashMap, Map, MapData};
    use ebpf_common::{FlowKey, NatEntry};
    let data = MapData::from_pin(tb.map_pin("NAT")).unwrap();
    let mut nat: HashMap<_, FlowKey, NatEntry> = HashMap::try_from(Map::LruHashMap(data)).unwrap();
    let keys: Vec<FlowKey> = nat.keys().filter_map(Result::ok).collect();
    for key in keys {
        let _ = nat.remove(&key);
    }
}

#[test]
fn one_pods_churn_evicts_no_other_pods_idle_flow() {
    let Some(mut c) = cluster("one_pods_churn_evicts_no_other_pods_idle_flow", "churnx", 228) else { return };
    let tb = &mut c.nodes[0];
    let [a, b]: [Attached; 2] = tb.add_attachments(2).unwrap().try_into().unwrap();
    let ext: Ipv4Addr = EXT_SERVER.parse().unwrap();

    // b's TCP connection, then idle.
    let syn = [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(b.ip, ext, TCP, &tcp(45_000, 443, 0x02))].concat();
    let (verdict, _, port) = frame_out(tb, syn);
    assert_eq!(verdict, TC_ACT_UNSPEC);

    // a opens flows to one destination after another (each within its per-destination share)
    // until its total is reached: far fewer than NAT holds, so nothing is evicted.
    let (opened, verdict) = open_until_refused(tb, &a, ext, (1..=40_000).map(|p| p as u16));

    let ack = [ethernet([2; 6], [4; 6], ETH_IPV4), ipv4(b.ip, ext, TCP, &tcp(45_000, 443, 0x10))].concat();
    let (verdict_b, _, again) = frame_out(tb, ack);
    assert_eq!((verdict_b, again), (TC_ACT_UNSPEC, port), "b's idle flow lost its port to a's churn of {opened} flows");
    assert_eq!((opened, verdict), (NAT_POD_MAX_FLOWS as usize, TC_ACT_SHOT), "a's churn stops at its total");
}
