//! Attacks on the pair entry (`POLICY_FLOW_KEY_PAIR`): the one entry a flow between two policy
//! subjects of this node gets, in place of each pod's own. What the pods' own entries did for
//! such a flow, the pair entry must do too (ICMP errors about the flow), and what it costs must
//! be paid by the pod that makes it needed (one pod's churn must not spend another's budget).
//! The maps are written straight from the test, as the agent would.
use std::{net::Ipv4Addr, time::Instant};

use ebpf_cni_tests::{
    Attached, Testbed,
    frames::{self, ethernet},
    policy_maps::{A, B, C, Policy, TCP, UDP},
    prog_run::{self, TC_ACT_REDIRECT, TC_ACT_SHOT},
};
use ebpf_common::{
    DropReason, FLOW_TIMEOUT_TCP_FIN_NS, FLOW_TIMEOUT_TCP_NS, FlowKey, POLICY_DIRECTION_EGRESS,
    POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED, POLICY_FLOW_CLOSING, POLICY_FLOW_KEY_PAIR,
    POLICY_INGRESS_ISOLATED, POLICY_NEW_ENTRIES_PER_SECOND, PolicyEndpoint, PolicyFlow,
};

fn pair_keys(policy: &Policy) -> Vec<FlowKey> {
    policy.all_flows().into_iter().filter(|k| k.pad[0] == POLICY_FLOW_KEY_PAIR).collect()
}

/// A UDP datagram `from` → `to` between the ports given, as `from_pod` gets it from `from`.
fn udp_ports(from: &Attached, to: Ipv4Addr, ports: (u16, u16)) -> Vec<u8> {
    let udp = [&ports.0.to_be_bytes()[..], &ports.1.to_be_bytes(), &12u16.to_be_bytes(), &[0, 0], b"flow"].concat();
    let packet = frames::ipv4(from.ip, to, UDP, &udp);
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), packet].concat())
}

/// A TCP segment `from` → `to` between the ports given, with `flags` (`frames::tcp`), as
/// `from_pod` gets it from `from`.
fn tcp_ports(from: &Attached, to: Ipv4Addr, ports: (u16, u16), flags: u8) -> Vec<u8> {
    let packet = frames::ipv4(from.ip, to, TCP, &frames::tcp(ports.0, ports.1, flags));
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), packet].concat())
}

/// An ICMP error from `from` to `to` (type, code) quoting `quoted` (an IPv4 packet).
fn icmp_error(from: &Attached, to: Ipv4Addr, kind: (u8, u8), quoted: &[u8]) -> Vec<u8> {
    let icmp = [&[kind.0, kind.1, 0, 0, 0, 0, 0x05, 0xdc][..], &quoted[..28]].concat();
    let packet = frames::ipv4(from.ip, to, 1, &icmp);
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), packet].concat())
}

/// `count` pods of a fresh node (at most three), given identities A, B and C in that order, and
/// the node's policy maps.
fn pods_with_identities(tb: &mut Testbed, count: usize) -> (Vec<Attached>, Policy) {
    let pods = tb.add_attachments(count).unwrap();
    let policy = Policy::with_identities(tb, pods.iter().zip([A, B, C]).map(|(pod, id)| (pod.ip, id)));
    (pods, policy)
}

/// The end of a test: the maps closed, then the `count` pods deleted (DEL clears their entries).
fn remove_pods(tb: &Testbed, policy: Policy, count: usize) {
    drop(policy);
    for pod in 0..count {
        tb.del(pod).unwrap();
    }
}

/// a's datagram to b, two subjects of this node: the flow gets its pair entry alone. b's stack
/// answers with a port unreachable (or a fragmentation needed): it quotes a's flow and must pass
/// where the flow's replies pass, as it did when each pod had its own entries (b's egress lets
/// nothing out, a's ingress nothing in: only the flow's state lets the error through). An error
/// about a flow a never opened still does not pass, and creates nothing.
#[test]
fn icmp_errors_about_a_flow_between_two_subjects_pass_and_no_others() {
    let test = "icmp_errors_about_a_flow_between_two_subjects_pass_and_no_others";
    let Some(mut tb) = Testbed::for_test(test, "polpi", "10.226.5.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 2);
    let (a, b) = (&pods[0], &pods[1]);
    // a lets nothing in; b lets a's UDP to port 53 in and nothing out.
    policy.subject(a.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED, 2, 2);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, Some(53), 3);
    let datagram = udp_ports(a, b.ip, (4000, 53));
    assert_eq!(prog_run::run(&tb, "from_pod", &a.host_ifname, datagram.clone()).0, TC_ACT_REDIRECT);
    assert_eq!(pair_keys(&policy).len(), 1, "the flow has no pair entry");
    let quoted = &datagram[14..];
    for kind in [(3, 3), (3, 4)] {
        let error = icmp_error(b, a.ip, kind, quoted);
        let verdict = prog_run::run(&tb, "from_pod", &b.host_ifname, error).0;
        assert_eq!(verdict, TC_ACT_REDIRECT, "{kind:?} about a's flow to b was dropped");
    }
    // The flow's reply passes too (the pair entry is there).
    let reply = udp_ports(b, a.ip, (53, 4000));
    assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, reply).0, TC_ACT_REDIRECT, "the reply");

    // About a flow a did not open (other ports): dropped, and nothing remembered.
    let before = policy.all_flows().len();
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    let other = udp_ports(a, b.ip, (4001, 53));
    let error = icmp_error(b, a.ip, (3, 3), &other[14..]);
    assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, error).0, TC_ACT_SHOT, "an unrelated error passed");
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 1);
    assert_eq!(policy.all_flows().len(), before, "an ICMP error created state");
    remove_pods(&tb, policy, 2);
}

/// a opens TCP connections to b (two subjects of this node) faster than its budget: past it,
/// a's SYNs get no pair entry, and each SYN-ACK b's stack answers with finds none either; the
/// SYN-ACK's checks allow it (b's egress is not isolated, a's ingress neither), and its pair
/// entry, if written, would be paid from b's bucket for pair entries, the sender's. So a's flood would
/// spend b's budget: b's own flows (a datagram to c, a pod no policy isolates) would go
/// unremembered, and their replies, which b's ingress does not allow on their own (UDP is
/// judged in its own direction), dropped. (fdf6ec4 had it too, once b's ingress budget was
/// spent on the flows a opened to b.) a's pair bucket refused its entries, so a is over:
/// a packet to it other than a SYN writes no pair entry (`budget.rs`: who pays), and b pays
/// nothing. b's own connection to a, opened meanwhile, is b's to pay for: remembered. A
/// second after a's flood, a is no longer over.
#[test]
fn a_pods_flood_to_another_does_not_spend_the_others_budget() {
    let test = "a_pods_flood_to_another_does_not_spend_the_others_budget";
    let Some(mut tb) = Testbed::for_test(test, "polpd", "10.226.6.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 3);
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    // a may open TCP to b; b lets a's TCP in and nothing else (its egress is not isolated).
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 0, 1);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, None, 1);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED, 2, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, None, 2);

    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    // Enough that, without the rule, b's answers would need more than b's budget over the time.
    let flood = 6 * entries;
    // a's port and b's: more flows than a's ports, so b's port changes every 40,000.
    let ports = |i: usize| (10_000 + (i % 40_000) as u16, 80 + (i / 40_000) as u16);
    // b's stack answers each SYN a moment after it: the flood goes in rounds, a's SYNs then
    // b's SYN-ACKs to them; b's own datagrams to c go out among the last answers.
    let own = 64;
    let round = 2048;
    let started = Instant::now();
    for first in (0..flood).step_by(round) {
        let syns: Vec<Vec<u8>> = (first..first + round).map(|i| tcp_ports(a, b.ip, ports(i), 0x02)).collect();
        let verdicts = prog_run::run_each(&tb, "from_pod", &a.host_ifname, syns).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed SYN was dropped");
        let mut frames: Vec<Vec<u8>> =
            (first..first + round).map(|i| tcp_ports(b, a.ip, (ports(i).1, ports(i).0), 0x12)).collect();
        if first + round >= flood {
            frames.extend((0..own).map(|j| udp_ports(b, c.ip, (20_000 + j, 53))));
        }
        let verdicts = prog_run::run_each(&tb, "from_pod", &b.host_ifname, frames).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed SYN-ACK or datagram was dropped");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let pairs = pair_keys(&policy).len();
    eprintln!("{pairs} pair entries after a's {flood} SYNs and b's answers, in {elapsed:.2} s");

    // b's own connection to a: its SYN pays from b's budget, a's state notwithstanding.
    let before = pairs;
    let syn = tcp_ports(b, a.ip, (30_000, 8080), 0x02);
    assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, syn).0, TC_ACT_REDIRECT, "b's SYN to a");
    assert_eq!(pair_keys(&policy).len(), before + 1, "b's own connection to a is not remembered");

    // c's replies to b's datagrams: b's own flows, within b's own budget.
    let replies: Vec<Vec<u8>> = (0..own).map(|j| udp_ports(c, b.ip, (53, 20_000 + j))).collect();
    let verdicts = prog_run::run_each(&tb, "from_pod", &c.host_ifname, replies).unwrap();
    let dropped = verdicts.iter().filter(|v| **v == TC_ACT_SHOT).count();
    assert_eq!(dropped, 0, "{dropped} of {own} replies to b's own flows dropped: a's flood spent b's budget");
    // And a's flood got no more pair entries than a's own budget.
    let budget = entries + (entries as f64 * (elapsed + 0.02)) as usize;
    assert!(pairs <= budget, "{pairs} pair entries for a's flows over {elapsed:.2} s: more than a's budget {budget}");

    // A second after a's last refused entry a is no longer over: b's datagram to a (which may
    // answer or open: nothing tells) is remembered again, paid by b.
    let before = pair_keys(&policy).len();
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let datagram = udp_ports(b, a.ip, (20_000, 4000));
    assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, datagram).0, TC_ACT_REDIRECT, "b's datagram to a");
    assert_eq!(pair_keys(&policy).len(), before + 1, "a is still over a second after its flood");
    remove_pods(&tb, policy, 3);
}

/// The other way round: b sends a, another subject of this node, datagrams and SYN-ACKs (forged:
/// a never opened those connections) faster than b's budget. Their pair entries are paid by
/// b, the sender, never by a, the receiver: a's own flows (datagrams to c, a pod no policy
/// isolates) are remembered, and c's replies, which a's ingress does not allow on their own,
/// come in.
#[test]
fn a_pods_answers_and_forgeries_to_another_spend_only_its_own_budget() {
    let test = "a_pods_answers_and_forgeries_to_another_spend_only_its_own_budget";
    let Some(mut tb) = Testbed::for_test(test, "polpa", "10.226.8.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 3);
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    // a lets b's UDP and TCP in and nothing else; b's egress is isolated, open to a.
    policy.subject(a.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.allow(A, B, POLICY_DIRECTION_INGRESS, UDP, None, 1);
    policy.allow(A, B, POLICY_DIRECTION_INGRESS, TCP, None, 1);
    policy.subject(b.ip, B, POLICY_EGRESS_ISOLATED, 0, 2);
    policy.allow(B, A, POLICY_DIRECTION_EGRESS, UDP, None, 2);
    policy.allow(B, A, POLICY_DIRECTION_EGRESS, TCP, None, 2);

    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    let flood = 3 * entries / 2;
    let port = |i: usize| 10_000 + i as u16;
    let mut frames: Vec<Vec<u8>> = (0..flood).map(|i| udp_ports(b, a.ip, (53, port(i)))).collect();
    frames.extend((0..flood).map(|i| tcp_ports(b, a.ip, (80, port(i)), 0x12)));
    let started = Instant::now();
    let verdicts = prog_run::run_each(&tb, "from_pod", &b.host_ifname, frames).unwrap();
    assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed datagram or SYN-ACK was dropped");
    // a's own datagrams to c, among b's flood.
    let own = 64;
    let datagrams: Vec<Vec<u8>> = (0..own).map(|j| udp_ports(a, c.ip, (20_000 + j, 53))).collect();
    let verdicts = prog_run::run_each(&tb, "from_pod", &a.host_ifname, datagrams).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "a's datagram to c was dropped");
    let pairs = pair_keys(&policy).len();
    eprintln!("{pairs} pair entries after b's {} packets, in {elapsed:.2} s", 2 * flood);
    let budget = entries + (entries as f64 * (elapsed + 0.02)) as usize;
    assert!(pairs <= budget, "{pairs} pair entries for b's packets over {elapsed:.2} s: more than b's budget {budget}");
    assert!(pairs >= entries - 1, "b's budget was not used: {pairs}");

    let replies: Vec<Vec<u8>> = (0..own).map(|j| udp_ports(c, a.ip, (53, 20_000 + j))).collect();
    let verdicts = prog_run::run_each(&tb, "from_pod", &c.host_ifname, replies).unwrap();
    let dropped = verdicts.iter().filter(|v| **v == TC_ACT_SHOT).count();
    assert_eq!(dropped, 0, "{dropped} of {own} replies to a's own flows dropped: b's packets spent a's budget");
    remove_pods(&tb, policy, 3);
}

/// Forged TCP segments between two subjects of this node: a's ACK, RST, FIN and SYN-ACK to a
/// port of b that b lets nothing into (and b's egress nothing out, so none is a reply b's rules
/// could infer) are dropped, and leave no pair entry, nor any other, for a later packet to ride.
#[test]
fn forged_tcp_segments_between_two_subjects_pass_nothing_and_leave_nothing() {
    let test = "forged_tcp_segments_between_two_subjects_pass_nothing_and_leave_nothing";
    let Some(mut tb) = Testbed::for_test(test, "polpf", "10.226.7.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 2);
    let (a, b) = (&pods[0], &pods[1]);
    policy.subject(a.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED, 2, 2);
    for flags in [0x10, 0x04, 0x14, 0x11, 0x12, 0x18] {
        let forged = tcp_ports(a, b.ip, (5000, 22), flags);
        assert_eq!(prog_run::run(&tb, "from_pod", &a.host_ifname, forged).0, TC_ACT_SHOT, "flags {flags:#x} passed");
    }
    assert_eq!(policy.all_flows().len(), 0, "a forged segment created state");
    // b's answer to them (a RST) is no reply of an allowed flow either.
    let rst = tcp_ports(b, a.ip, (22, 5000), 0x14);
    assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, rst).0, TC_ACT_SHOT, "b's RST passed");
    assert_eq!(policy.all_flows().len(), 0, "a RST created state");
    remove_pods(&tb, policy, 2);
}

/// Attack (attack3): a peer that is not a pair peer (here x, a pod no policy isolates; a LAN
/// host or another node's pod does the same) keeps v "over" from outside. v's ingress lets x's
/// TCP in; x opens connections to v faster than v's ingress budget, so v's own entries for
/// them go unwritten and each SYN-ACK v's stack answers is a new flow for v's egress check,
/// paid from v's egress bucket, which refuses. Meanwhile p, a subject of this node whose
/// ingress lets nothing in, asks v (port 53, allowed) over UDP. Were v's egress bucket the one
/// that makes it "over", no pair entry would be written (a datagram is no SYN), and v's answer,
/// judged on its own in p's ingress, would be dropped for as long as x keeps up its SYNs. Only
/// v's bucket for pair entries makes it over, which x cannot spend: every answer comes in.
#[test]
fn an_outsider_cannot_make_a_server_over_for_its_same_node_clients() {
    let test = "an_outsider_cannot_make_a_server_over_for_its_same_node_clients";
    let Some(mut tb) = Testbed::for_test(test, "polpo", "10.226.9.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 3);
    let (p, v, x) = (&pods[0], &pods[1], &pods[2]);
    // p lets nothing in (a client). v lets p's UDP to 53 in and x's TCP (a public server).
    policy.subject(p.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.subject(v.ip, B, POLICY_INGRESS_ISOLATED, 2, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, Some(53), 2);
    policy.allow(B, C, POLICY_DIRECTION_INGRESS, TCP, None, 2);

    // Before: p's query and v's answer pass.
    let query = udp_ports(p, v.ip, (40_000, 53));
    assert_eq!(prog_run::run(&tb, "from_pod", &p.host_ifname, query).0, TC_ACT_REDIRECT, "p's query");
    let answer = udp_ports(v, p.ip, (53, 40_000));
    assert_eq!(prog_run::run(&tb, "from_pod", &v.host_ifname, answer).0, TC_ACT_REDIRECT, "v's answer before");

    // x's SYNs to v, and v's SYN-ACKs, in rounds.
    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    let flood = 3 * entries;
    let round = 2048;
    let ports = |i: usize| (10_000 + (i % 40_000) as u16, 80 + (i / 40_000) as u16);
    for first in (0..flood).step_by(round) {
        let syns: Vec<Vec<u8>> = (first..first + round).map(|i| tcp_ports(x, v.ip, ports(i), 0x02)).collect();
        let verdicts = prog_run::run_each(&tb, "from_pod", &x.host_ifname, syns).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed SYN was dropped");
        let acks: Vec<Vec<u8>> =
            (first..first + round).map(|i| tcp_ports(v, x.ip, (ports(i).1, ports(i).0), 0x12)).collect();
        let verdicts = prog_run::run_each(&tb, "from_pod", &v.host_ifname, acks).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed SYN-ACK was dropped");
    }

    // p asks again (a new port, as a resolver does): allowed both ways by the rules.
    let mut dropped = 0;
    for j in 0..16u16 {
        let query = udp_ports(p, v.ip, (41_000 + j, 53));
        assert_eq!(prog_run::run(&tb, "from_pod", &p.host_ifname, query).0, TC_ACT_REDIRECT, "p's query");
        let answer = udp_ports(v, p.ip, (53, 41_000 + j));
        if prog_run::run(&tb, "from_pod", &v.host_ifname, answer).0 == TC_ACT_SHOT {
            dropped += 1;
        }
    }
    remove_pods(&tb, policy, 3);
    assert_eq!(dropped, 0, "{dropped} of 16 answers to p's allowed queries dropped: x keeps v over");
}

/// The same with a DNS server's traffic alone (attack3): v lets UDP to port 53 in from anyone
/// (here x and p), as a cluster DNS pod does; x's queries from many ports (other nodes' clients
/// at a busy hour do the same) spend v's ingress budget, then v's answers its egress one; p, a
/// client on v's node that lets nothing in, still gets every answer (v's pair bucket is
/// untouched, so v is not over).
#[test]
fn a_busy_dns_server_keeps_its_same_node_clients_answers() {
    let test = "a_busy_dns_server_keeps_its_same_node_clients_answers";
    let Some(mut tb) = Testbed::for_test(test, "polpq", "10.226.10.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 3);
    let (p, v, x) = (&pods[0], &pods[1], &pods[2]);
    policy.subject(p.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    policy.subject(v.ip, B, POLICY_INGRESS_ISOLATED, 2, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, Some(53), 2);
    policy.allow(B, C, POLICY_DIRECTION_INGRESS, UDP, Some(53), 2);

    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    let flood = 3 * entries;
    let round = 2048;
    let ports = |i: usize| (1_024 + (i % 60_000) as u16, 53);
    for first in (0..flood).step_by(round) {
        let queries: Vec<Vec<u8>> = (first..first + round).map(|i| udp_ports(x, v.ip, ports(i))).collect();
        let verdicts = prog_run::run_each(&tb, "from_pod", &x.host_ifname, queries).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed query was dropped");
        let answers: Vec<Vec<u8>> =
            (first..first + round).map(|i| udp_ports(v, x.ip, (ports(i).1, ports(i).0))).collect();
        let verdicts = prog_run::run_each(&tb, "from_pod", &v.host_ifname, answers).unwrap();
        assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an answer to x was dropped");
    }
    let mut dropped = 0;
    for j in 0..16u16 {
        let query = udp_ports(p, v.ip, (41_000 + j, 53));
        assert_eq!(prog_run::run(&tb, "from_pod", &p.host_ifname, query).0, TC_ACT_REDIRECT, "p's query");
        let answer = udp_ports(v, p.ip, (53, 41_000 + j));
        if prog_run::run(&tb, "from_pod", &v.host_ifname, answer).0 == TC_ACT_SHOT {
            dropped += 1;
        }
    }
    remove_pods(&tb, policy, 3);
    assert_eq!(dropped, 0, "{dropped} of 16 answers to p's allowed queries dropped: v is over from x's queries");
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

/// CLOCK_MONOTONIC, the clock the entries' times are on.
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a plain call with a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `from_pod`'s verdict on `frame` from `from`, on `cpu`: the per-CPU scratch value the checks
/// share is the one every run of a test's sequence finds (what one packet left, the next reads).
fn verdict_on(tb: &Testbed, cpu: usize, from: &Attached, frame: Vec<u8>) -> u32 {
    prog_run::run_on_cpu(tb, cpu, "from_pod", &from.host_ifname, frame).0
}

/// A TCP connection between two subjects of this node, each isolated both ways, once its pair
/// entry is all that allows it (the rules that allowed it taken back): its segments (ACK, FIN,
/// RST, either way) and an ICMP error about it ride the entry; a SYN never does, nor a forged
/// segment of another connection between the same pods, run right after a segment that rode
/// (the pair lookup's tuple left in the CPU's scratch value is not what the sender's check
/// judges). The same entry of another pair of pods (a deleted pod's, its address reused), or
/// past its timeout, is no entry: the sender's check, called when the pair lookup misses,
/// judges the packet and denies it.
#[test]
fn a_pair_flows_packets_ride_its_entry_only_while_it_is_theirs_and_live() {
    let test = "a_pair_flows_packets_ride_its_entry_only_while_it_is_theirs_and_live";
    let Some(mut tb) = Testbed::for_test(test, "polpl", "10.226.11.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 2);
    let (a, b) = (&pods[0], &pods[1]);
    let cpu = prog_run::cpus()[0];
    let both = POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED;
    policy.subject(a.ip, A, both, 1, 1);
    policy.subject(b.ip, B, both, 2, 2);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80), 1);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(80), 2);
    let from_a = |flags| tcp_ports(a, b.ip, (5000, 80), flags);
    let from_b = |flags| tcp_ports(b, a.ip, (80, 5000), flags);
    let error_about_a = || icmp_error(b, a.ip, (3, 3), &from_a(ACK)[14..]);
    assert_eq!(verdict_on(&tb, cpu, a, from_a(SYN)), TC_ACT_REDIRECT, "a's SYN");
    assert_eq!(verdict_on(&tb, cpu, b, from_b(SYN | ACK)), TC_ACT_REDIRECT, "b's SYN-ACK");
    let pairs = pair_keys(&policy);
    assert_eq!(pairs.len(), 1, "the connection has no pair entry");
    let key = pairs[0];

    // The policy changes: nothing allows the connection but its entry.
    policy.disallow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80));
    policy.disallow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(80));
    let forged = tcp_ports(a, b.ip, (5001, 80), ACK);
    for round in 0..2 {
        assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_REDIRECT, "round {round}: a's ACK");
        // Right after a packet that rode the entry, on the same CPU: judged on its own tuple.
        assert_eq!(verdict_on(&tb, cpu, a, forged.clone()), TC_ACT_SHOT, "round {round}: a forged ACK passed");
        assert_eq!(verdict_on(&tb, cpu, b, from_b(ACK)), TC_ACT_REDIRECT, "round {round}: b's ACK");
        assert_eq!(verdict_on(&tb, cpu, b, error_about_a()), TC_ACT_REDIRECT, "round {round}: the ICMP error");
        // A new connection on the same ports gets today's policy: none.
        assert_eq!(verdict_on(&tb, cpu, a, from_a(SYN)), TC_ACT_SHOT, "round {round}: a SYN rode the entry");
    }
    assert_eq!(policy.all_flows(), vec![key], "a denied packet left state");

    // The entry as another pair of pods' (an owner of neither), then past its timeouts: none.
    let entry = policy.flows.get(&key, 0).unwrap();
    let second = 1_000_000_000;
    let mut unlive = vec![
        ("of other pods", PolicyFlow { owner: entry.owner ^ 0x5a5a, last_seen_ns: now_ns(), ..entry }),
        (
            "closing past its timeout",
            PolicyFlow {
                last_seen_ns: now_ns() - FLOW_TIMEOUT_TCP_FIN_NS - 2 * second,
                flags: entry.flags | POLICY_FLOW_CLOSING,
                ..entry
            },
        ),
    ];
    // Idle past a day: only on a machine up for longer (CLOCK_MONOTONIC starts at boot).
    if let Some(seen) = now_ns().checked_sub(FLOW_TIMEOUT_TCP_NS + 2 * second) {
        unlive.push(("idle past its timeout", PolicyFlow { last_seen_ns: seen, ..entry }));
    }
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    for (what, flow) in &unlive {
        policy.flows.insert(key, flow, 0).unwrap();
        assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_SHOT, "a's ACK rode an entry {what}");
        assert_eq!(verdict_on(&tb, cpu, b, from_b(ACK)), TC_ACT_SHOT, "b's ACK rode an entry {what}");
        assert_eq!(verdict_on(&tb, cpu, b, error_about_a()), TC_ACT_SHOT, "an ICMP error rode an entry {what}");
    }
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 3 * unlive.len() as u64);
    // Live and theirs again: the key is the one the checks look up; then the connection closes.
    policy.flows.insert(key, PolicyFlow { last_seen_ns: now_ns(), ..entry }, 0).unwrap();
    for (from, frame, what) in
        [(a, from_a(FIN | ACK), "a's FIN"), (b, from_b(FIN | ACK), "b's FIN"), (a, from_a(RST), "a's RST")]
    {
        assert_eq!(verdict_on(&tb, cpu, from, frame), TC_ACT_REDIRECT, "{what}");
    }
    let closing = policy.flows.get(&key, 0).unwrap();
    assert_ne!(closing.flags & POLICY_FLOW_CLOSING, 0, "a FIN did not start the entry's closing");
    remove_pods(&tb, policy, 2);
}

/// b's ICMP error to a (two subjects of this node) about a flow that has no pair entry: the
/// pair lookup re-keyed the tuple as the flow it quotes, so the sender's check, called next,
/// must read the packet again and judge the error as itself (ICMP, no ports), never as the
/// UDP flow it quotes, which b's rules allow: dropped. With b's egress open to ICMP, allowed
/// (judged as itself), and still no pair entry. The same for an error whose quote is cut short
/// (the pair lookup gives up half-way through keying it).
#[test]
fn an_icmp_error_without_a_pair_entry_is_judged_as_itself() {
    let test = "an_icmp_error_without_a_pair_entry_is_judged_as_itself";
    let Some(mut tb) = Testbed::for_test(test, "polpe", "10.226.12.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 2);
    let (a, b) = (&pods[0], &pods[1]);
    let cpu = prog_run::cpus()[0];
    // a is a subject whose ingress is open; b may send a UDP to port 4000 and nothing else.
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 1, 1);
    policy.subject(b.ip, B, POLICY_EGRESS_ISOLATED, 2, 2);
    policy.allow(B, A, POLICY_DIRECTION_EGRESS, UDP, Some(4000), 2);
    // The rule is the one meant: b's datagram (another flow than the quoted one) passes.
    let datagram = udp_ports(b, a.ip, (54, 4000));
    assert_eq!(verdict_on(&tb, cpu, b, datagram), TC_ACT_REDIRECT, "b's datagram to a's port 4000");
    policy.forget_flows();

    // a's datagram a:4000 → b:53, never sent: the error keyed as its reply is b:53 → a:4000.
    let quoted = udp_ports(a, b.ip, (4000, 53));
    let error = icmp_error(b, a.ip, (3, 3), &quoted[14..]);
    let cut = {
        let icmp = [&[3, 3, 0, 0, 0, 0, 0, 0][..], &quoted[14..34]].concat();
        let packet = frames::ipv4(b.ip, a.ip, 1, &icmp);
        frames::with_checksums([ethernet(b.host_mac, b.pod_mac, 0x0800), packet].concat())
    };
    for (frame, what) in [(&error, "an error"), (&cut, "an error quoting a cut packet")] {
        // A packet whose pair lookup hit first, on the same CPU (its tuple left in the scratch).
        assert_eq!(verdict_on(&tb, cpu, b, frame.clone()), TC_ACT_SHOT, "{what} passed as the flow it quotes");
    }
    assert!(policy.all_flows().is_empty(), "a denied error left state");
    policy.allow(B, A, POLICY_DIRECTION_EGRESS, 1, None, 2);
    for (frame, what) in [(&error, "an error"), (&cut, "an error quoting a cut packet")] {
        assert_eq!(verdict_on(&tb, cpu, b, frame.clone()), TC_ACT_REDIRECT, "{what} to a, allowed as ICMP, dropped");
    }
    assert!(pair_keys(&policy).is_empty(), "an ICMP error wrote a pair entry");
    remove_pods(&tb, policy, 2);
}

/// A flow between two subjects, known by its pair entry, when the receiver stops being a
/// subject (its `POLICY_ENDPOINTS` entry with no flags, or cleared): the pair lookup is not
/// made, and the sender's check judges alone. The sender's rules taken back, its mid-stream ACK
/// is dropped (the pair entry is not the sender's own); given back, it passes. The receiver a
/// subject again: the pair entry carries the flow once more.
#[test]
fn a_receiver_that_stops_being_a_subject_leaves_the_sender_to_its_own_check() {
    let test = "a_receiver_that_stops_being_a_subject_leaves_the_sender_to_its_own_check";
    let Some(mut tb) = Testbed::for_test(test, "polps", "10.226.13.0/24") else { return };
    let (pods, mut policy) = pods_with_identities(&mut tb, 2);
    let (a, b) = (&pods[0], &pods[1]);
    let cpu = prog_run::cpus()[0];
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 1, 1);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED, 2, 2);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80), 1);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(80), 2);
    let from_a = |flags| tcp_ports(a, b.ip, (5000, 80), flags);
    assert_eq!(verdict_on(&tb, cpu, a, from_a(SYN)), TC_ACT_REDIRECT, "a's SYN");
    assert_eq!(pair_keys(&policy).len(), 1, "the connection has no pair entry");
    policy.disallow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80));
    assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_REDIRECT, "a's ACK on the pair entry");

    let b_entry = policy.entry(b.ip, B, POLICY_INGRESS_ISOLATED, 2, 2);
    let slot = ebpf_common::host_veth_slot(b_entry.ifindex);
    let not_a_subject = [PolicyEndpoint { flags: 0, ..b_entry }, PolicyEndpoint { ifindex: 0, flags: 0, ..b_entry }];
    for (i, entry) in not_a_subject.iter().enumerate() {
        policy.subjects.set(slot, entry, 0).unwrap();
        assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_SHOT, "{i}: a's ACK rode the pair entry alone");
    }
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80), 1);
    assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_REDIRECT, "a's ACK its rules allow");
    // b a subject again, every rule taken back, a's own entries (of the ACK just judged) gone:
    // only the pair entry can carry the flow.
    policy.disallow(A, B, POLICY_DIRECTION_EGRESS, TCP, Some(80));
    policy.disallow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(80));
    for key in policy.all_flows().into_iter().filter(|k| k.pad[0] != POLICY_FLOW_KEY_PAIR) {
        policy.flows.remove(&key).unwrap();
    }
    policy.subjects.set(slot, b_entry, 0).unwrap();
    assert_eq!(verdict_on(&tb, cpu, a, from_a(ACK)), TC_ACT_REDIRECT, "a's ACK on the pair entry again");
    remove_pods(&tb, policy, 2);
}
