//! NetworkPolicy in the datapath under the cases that would let a pod go unenforced or pass on
//! state that is not its own: two pods whose host veths share a `POLICY_ENDPOINTS` slot, a new
//! pod given a deleted pod's address, one pod opening flows without end (in a burst within a
//! tick too), entries aged by a clock each CPU keeps for a tick, ICMP errors.
//! The maps are written straight from the test, as the agent would.
use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    Attached, Testbed,
    frames::{self, ethernet},
    policy_maps::{A, B, C, Policy, TCP, UDP, pod_object, policy_set},
    probe::{self, Servers},
    prog_run::{self, TC_ACT_REDIRECT, TC_ACT_SHOT},
    run_in,
};
use ebpf_common::{
    DropReason, FAMILY_IPV4, FLOW_TIMEOUT_UDP_NS, FlowKey, HOST_VETHS_SLOTS, POLICY_DIRECTION_EGRESS,
    POLICY_DIRECTION_INGRESS, POLICY_EGRESS_ISOLATED, POLICY_FLOW_KEY_PAIR, POLICY_FLOW_KEY_SUBJECT_RECEIVES,
    POLICY_FLOW_KEY_SUBJECT_SENDS, POLICY_FLOW_OPENER_OK, POLICY_FLOW_ORIGINAL, POLICY_INGRESS_ISOLATED,
    POLICY_NEW_ENTRIES_PER_SECOND, PolicyEndpoint, PolicyFlow, host_veth_slot,
};
use serde_json::json;

const D: u32 = 259;

fn ifindex_of(tb: &Testbed, ifname: &str) -> u32 {
    let out = run_in(&tb.node.name, "ip", &["-j", "link", "show", "dev", ifname]).unwrap();
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["ifindex"].as_u64().unwrap() as u32
}

/// Moves the node's next ifindex to `next` (the kernel hands them out in turn): bridges (no
/// dummy driver here) made up to `next - 1` and left for the node's namespace to take away
/// (deleting them one by one waits for RCU each time: minutes).
fn skip_ifindexes_to(tb: &Testbed, next: u32) {
    run_in(&tb.node.name, "ip", &["link", "add", "skip0", "type", "bridge"]).unwrap();
    let first = ifindex_of(tb, "skip0");
    assert!(first < next, "the node's ifindexes are already past {next}");
    let batch = tb.data_dir().join("skip.batch");
    let adds: String = (1..next - first).map(|i| format!("link add skip{i} type bridge\n")).collect();
    fs::create_dir_all(tb.data_dir()).unwrap();
    fs::write(&batch, adds).unwrap();
    run_in(&tb.node.name, "ip", &["-batch", batch.to_str().unwrap()]).unwrap();
}

fn reaches(netns: &str, at: SocketAddrV4) -> bool {
    probe::ask_tcp(netns, at).is_ok()
}

/// Two live pods whose host veths share a slot (ifindexes equal modulo the slots), placed as
/// the agent places them: the lower ifindex in the slot, the other in
/// `POLICY_ENDPOINTS_BY_IFINDEX`. Each is enforced by its own entry, never by its neighbour's;
/// when the slot's pod goes (DEL), the other moves into the slot and stays enforced.
#[test]
fn pods_sharing_a_slot_are_each_enforced_by_their_own_entry() {
    let test = "pods_sharing_a_slot_are_each_enforced_by_their_own_entry";
    let Some(mut tb) = Testbed::for_test(test, "polsl", "10.220.0.0/24") else { return };
    let mut pods = tb.add_attachments(3).unwrap();
    let b_ifindex = ifindex_of(&tb, &pods[1].host_ifname);
    skip_ifindexes_to(&tb, b_ifindex + HOST_VETHS_SLOTS);
    pods.extend(tb.add_attachments(1).unwrap());
    let (a, b, c, d) = (&pods[0], &pods[1], &pods[2], &pods[3]);
    let d_ifindex = ifindex_of(&tb, &d.host_ifname);
    assert_eq!(host_veth_slot(d_ifindex), host_veth_slot(b_ifindex), "no collision: {b_ifindex}, {d_ifindex}");
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(b.ip, 8080)).unwrap();
    servers.tcp(&ns[3], SocketAddrV4::new(d.ip, 8080)).unwrap();

    let mut policy = Policy::with_identities(&tb, [(a.ip, A), (b.ip, B), (c.ip, C), (d.ip, D)]);
    // b lets in a only, d lets in c only: each pod's rules, each pod's verdicts.
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, TCP, Some(8080), 2);
    policy.allow(D, C, POLICY_DIRECTION_INGRESS, TCP, Some(8080), 3);
    let d_entry = policy.entry(d.ip, D, POLICY_INGRESS_ISOLATED, 1, 0);
    let mut by_ifindex = Policy::by_ifindex(&tb);
    by_ifindex.insert(d_ifindex, d_entry, 0).unwrap();
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED, 1, 0);
    let at = |pod: &Attached| SocketAddrV4::new(pod.ip, 8080);
    assert!(reaches(&ns[0], at(b)), "a → b: b's rule");
    assert!(!reaches(&ns[2], at(b)), "c → b: b lets only a in");
    assert!(reaches(&ns[2], at(d)), "c → d: d's rule, though the slot is b's");
    assert!(!reaches(&ns[0], at(d)), "a → d: d is enforced, though the slot is b's (it lets only c in)");

    // Without its entry, d would be judged by nobody's: a pod the agent has not written.
    // With an entry of another attachment (d's veth's previous pod), d is not that pod.
    let mut stale = d_entry;
    stale.owner ^= 1;
    by_ifindex.insert(d_ifindex, stale, 0).unwrap();
    assert!(reaches(&ns[0], at(d)), "a → d: an entry of another attachment decided for d");
    by_ifindex.insert(d_ifindex, d_entry, 0).unwrap();
    assert!(!reaches(&ns[0], at(d)), "a → d with d's entry back");

    // b goes: DEL gives d the slot (written over b's, then out of the hash), still enforced.
    let slot = host_veth_slot(b_ifindex);
    tb.del(1).unwrap();
    assert_eq!(policy.subjects.get(&slot, 0).unwrap(), d_entry, "DEL did not move d into the slot b left");
    assert!(by_ifindex.get(&d_ifindex, 0).is_err(), "d is still in POLICY_ENDPOINTS_BY_IFINDEX");
    assert!(reaches(&ns[2], at(d)), "c → d after b's DEL");
    assert!(!reaches(&ns[0], at(d)), "a → d after b's DEL");
    // d goes: nothing of it stays.
    tb.del(3).unwrap();
    assert_eq!(policy.subjects.get(&slot, 0).unwrap(), PolicyEndpoint::default(), "DEL left d's slot");
    drop(servers);
    for pod in [0, 2] {
        tb.del(pod).unwrap();
    }
}

/// The same collision written by the agent's own writer (`ebpf-cni policy-set`): b keeps the
/// slot, d goes into `POLICY_ENDPOINTS_BY_IFINDEX`, each enforced by its own policy. After b's
/// DEL (which moves d into the slot), a second run agrees with what DEL did and leaves d enforced.
#[test]
fn policy_set_places_pods_sharing_a_slot() {
    let test = "policy_set_places_pods_sharing_a_slot";
    let Some(mut tb) = Testbed::for_test(test, "polss", "10.224.0.0/24") else { return };
    let mut pods = tb.add_attachments(3).unwrap();
    let b_ifindex = ifindex_of(&tb, &pods[1].host_ifname);
    skip_ifindexes_to(&tb, b_ifindex + HOST_VETHS_SLOTS);
    pods.extend(tb.add_attachments(1).unwrap());
    let (a, b, c, d) = (&pods[0], &pods[1], &pods[2], &pods[3]);
    let d_ifindex = ifindex_of(&tb, &d.host_ifname);
    assert_eq!(host_veth_slot(d_ifindex), host_veth_slot(b_ifindex), "no collision: {b_ifindex}, {d_ifindex}");
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let mut servers = Servers::default();
    servers.tcp(&ns[1], SocketAddrV4::new(b.ip, 8080)).unwrap();
    servers.tcp(&ns[3], SocketAddrV4::new(d.ip, 8080)).unwrap();

    // b lets in a only, d lets in c only.
    let allow = |name: &str, subject: &str, peer: &str| {
        json!({
            "metadata": {"namespace": "x", "name": name},
            "spec": {"podSelector": {"matchLabels": {"app": subject}},
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer}}}],
                                  "ports": [{"port": 8080}]}]},
        })
    };
    let objects = |pods: &[(&str, &Attached)]| {
        json!({
            "namespaces": [{"metadata": {"name": "x"}}],
            "pods": pods.iter().map(|(n, p)| pod_object(n, json!({"app": n}), p.ip.into())).collect::<Vec<_>>(),
            "networkPolicies": [allow("b-from-a", "b", "a"), allow("d-from-c", "d", "c")],
        })
    };
    let wrote = policy_set(&tb, &objects(&[("a", a), ("b", b), ("c", c), ("d", d)]));
    assert_eq!(wrote["endpoints"], json!(4), "{wrote}");
    assert_eq!(wrote["endpoints_by_ifindex"], json!(1), "{wrote}");
    assert_eq!(wrote["problems"], json!([]), "{wrote}");
    let policy = Policy::open(&tb);
    let by_ifindex = Policy::by_ifindex(&tb);
    let slot = host_veth_slot(b_ifindex);
    assert_eq!(policy.subjects.get(&slot, 0).unwrap().ifindex, b_ifindex, "the lower ifindex keeps the slot");
    assert_eq!(by_ifindex.get(&d_ifindex, 0).unwrap().flags, POLICY_INGRESS_ISOLATED);
    let at = |pod: &Attached| SocketAddrV4::new(pod.ip, 8080);
    assert!(reaches(&ns[0], at(b)), "a → b: b's rule");
    assert!(!reaches(&ns[2], at(b)), "c → b: b lets only a in");
    assert!(reaches(&ns[2], at(d)), "c → d: d's rule, though the slot is b's");
    assert!(!reaches(&ns[0], at(d)), "a → d: d is enforced by its own entry");

    // b goes: DEL moves d into the slot; the writer's next run finds nothing left to fix.
    tb.del(1).unwrap();
    let again = policy_set(&tb, &objects(&[("a", a), ("c", c), ("d", d)]));
    assert_eq!(again["endpoints_by_ifindex"], json!(0), "{again}");
    assert_eq!(policy.subjects.get(&slot, 0).unwrap().ifindex, d_ifindex, "d is in the slot b left");
    assert!(by_ifindex.get(&d_ifindex, 0).is_err(), "d is still in POLICY_ENDPOINTS_BY_IFINDEX");
    assert!(reaches(&ns[2], at(d)), "c → d after b's DEL");
    assert!(!reaches(&ns[0], at(d)), "a → d after b's DEL");
    drop((servers, policy, by_ifindex));
    for pod in [0, 2, 3] {
        tb.del(pod).unwrap();
    }
}

/// A UDP datagram a → b (port 4000 to 4000), as `from_pod` gets it from a.
fn udp_frame(from: &Attached, to: &Attached) -> Vec<u8> {
    let datagram = frames::ipv4_udp(from.ip, to.ip, b"hello");
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), datagram].concat())
}

fn udp_key(from: Ipv4Addr, to: Ipv4Addr, end: u8) -> FlowKey {
    let mut key = FlowKey {
        family: FAMILY_IPV4,
        protocol: UDP,
        pad: [end, 0],
        src_port: 4000,
        dst_port: 4000,
        src_addr: [0; 16],
        dst_addr: [0; 16],
    };
    key.src_addr[..4].copy_from_slice(&from.octets());
    key.dst_addr[..4].copy_from_slice(&to.octets());
    key
}

/// The UDP flow b opened to a (b's egress and the reply's key), as `owner`'s entries, last
/// seen `age_ns` ago.
fn opened_by_b(policy: &mut Policy, a: Ipv4Addr, b: Ipv4Addr, owner: u64, age_ns: u64) {
    opened_by_b_at(policy, a, b, owner, now_ns() - age_ns);
}

/// [`opened_by_b`], last seen at `last_seen_ns` (CLOCK_MONOTONIC; it may be in the future).
fn opened_by_b_at(policy: &mut Policy, a: Ipv4Addr, b: Ipv4Addr, owner: u64, last_seen_ns: u64) {
    let flow = |flags| PolicyFlow { last_seen_ns, owner, slot: 0, flags };
    let original = flow(POLICY_FLOW_ORIGINAL | POLICY_FLOW_OPENER_OK);
    policy.flows.insert(udp_key(b, a, POLICY_FLOW_KEY_SUBJECT_SENDS), original, 0).unwrap();
    policy.flows.insert(udp_key(a, b, POLICY_FLOW_KEY_SUBJECT_RECEIVES), flow(POLICY_FLOW_OPENER_OK), 0).unwrap();
}

/// CLOCK_MONOTONIC, as `bpf_ktime_get_coarse_ns` reads it.
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a plain call with a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Two pods of a fresh node, a (identity A) and b (B), b letting nothing in: only the replies
/// of what b itself opened get to it. Returns them, the policy maps and b's owner.
fn b_closed_to_a(tb: &mut Testbed) -> (Vec<Attached>, Policy, u64) {
    let pods = tb.add_attachments(2).unwrap();
    let mut policy = Policy::open(tb);
    policy.identity(pods[0].ip, A);
    policy.identity(pods[1].ip, B);
    policy.subject(pods[1].ip, B, POLICY_INGRESS_ISOLATED, 1, 0);
    let b_owner = policy.entry(pods[1].ip, B, 0, 0, 0).owner;
    (pods, policy, b_owner)
}

/// `from_pod`'s verdict on a's datagram to b, once the maps hold only b's UDP flow to a, as
/// `owner`'s entries last seen `age_ns` ago.
fn a_answers_b(tb: &Testbed, policy: &mut Policy, pods: &[Attached], owner: u64, age_ns: u64) -> u32 {
    let (a, b) = (&pods[0], &pods[1]);
    policy.forget_flows();
    opened_by_b(policy, a.ip, b.ip, owner, age_ns);
    prog_run::run(tb, "from_pod", &a.host_ifname, udp_frame(a, b)).0
}

/// A deleted pod's flow entries outlive it (an LRU); a new pod that gets its address (and the
/// same ports) must not pass on them: an entry of another attachment is no entry.
#[test]
fn a_pod_at_a_deleted_pods_address_inherits_none_of_its_flows() {
    let test = "a_pod_at_a_deleted_pods_address_inherits_none_of_its_flows";
    let Some(mut tb) = Testbed::for_test(test, "polow", "10.221.0.0/24") else { return };
    let (pods, mut policy, b_owner) = b_closed_to_a(&mut tb);
    // The deleted pod's entries (another owner), with b's address and a's: a's datagram is
    // no reply of b's.
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    let verdict = a_answers_b(&tb, &mut policy, &pods, b_owner ^ 0x5a5a, 0);
    assert_eq!(verdict, TC_ACT_SHOT, "a's datagram passed on the deleted pod's entries");
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 1);
    // The same entries as b's own: the reply passes (the key is the one the check uses).
    let verdict = a_answers_b(&tb, &mut policy, &pods, b_owner, 0);
    assert_eq!(verdict, TC_ACT_REDIRECT, "the reply to b's own flow was dropped");
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// Entries age: b's UDP flow last seen its timeout (180 s) and two seconds ago is no entry, and
/// a's datagram, judged as new, is dropped (b lets nothing in); seen ten seconds within its
/// timeout, it is b's flow and the reply passes. So the checks' clock (`clock.rs`: the coarse
/// clock, read once per tick on each CPU) is CLOCK_MONOTONIC to within a second, on whichever
/// CPU runs the check and however long ago that CPU last read it.
#[test]
fn a_flow_entry_past_its_timeout_is_no_entry() {
    let test = "a_flow_entry_past_its_timeout_is_no_entry";
    let Some(mut tb) = Testbed::for_test(test, "polaj", "10.221.9.0/24") else { return };
    let (pods, mut policy, b_owner) = b_closed_to_a(&mut tb);
    const SECOND: u64 = 1_000_000_000;
    for round in 0..3 {
        let verdict = a_answers_b(&tb, &mut policy, &pods, b_owner, FLOW_TIMEOUT_UDP_NS + 2 * SECOND);
        assert_eq!(verdict, TC_ACT_SHOT, "round {round}: a's datagram passed on an entry past its timeout");
        let verdict = a_answers_b(&tb, &mut policy, &pods, b_owner, FLOW_TIMEOUT_UDP_NS - 10 * SECOND);
        assert_eq!(verdict, TC_ACT_REDIRECT, "round {round}: the reply to b's live flow was dropped");
        // The next round a tick or more later: the clock read again, or kept from this one.
        std::thread::sleep(std::time::Duration::from_millis(300 * round));
    }
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// The checks' clock is a coarse read kept per CPU until `jiffies` moves (`clock.rs`). On no
/// CPU does it keep an entry past its timeout or end a live one early: not at a CPU's first
/// check here (the first since the load, unless a pod's own packet came first: nothing kept),
/// not on a CPU idle for 100 ms or 1.5 s since its last check (its kept read that old, NO_HZ
/// having stopped its tick), not for entries from a clock ahead of the check's (CLOCK_MONOTONIC
/// read precisely, as another CPU's newer read would be), not for an entry one CPU keeps alive
/// and another reads. And what a check writes is CLOCK_MONOTONIC to within a few ticks.
#[test]
fn no_cpus_kept_clock_keeps_an_entry_past_its_timeout_or_ends_one_early() {
    let test = "no_cpus_kept_clock_keeps_an_entry_past_its_timeout_or_ends_one_early";
    let Some(mut tb) = Testbed::for_test(test, "polck", "10.221.10.0/24") else { return };
    let (pods, mut policy, b_owner) = b_closed_to_a(&mut tb);
    let (a, b) = (&pods[0], &pods[1]);
    const MS: u64 = 1_000_000;
    let timeout = FLOW_TIMEOUT_UDP_NS;
    let cpus = prog_run::cpus();
    let answer_on = |cpu| prog_run::run_on_cpu(&tb, cpu, "from_pod", &a.host_ifname, udp_frame(a, b)).0;
    let b_flow_from = |policy: &mut Policy, last_seen_ns| {
        policy.forget_flows();
        opened_by_b_at(policy, a.ip, b.ip, b_owner, last_seen_ns);
    };

    for &cpu in &cpus {
        b_flow_from(&mut policy, now_ns() - timeout - 50 * MS);
        assert_eq!(answer_on(cpu), TC_ACT_SHOT, "CPU {cpu}'s first check: an entry past its timeout passed");
    }
    // The CPU's kept read is from before the entry was written; the entry's timeout comes 30 ms
    // after it was written, the check 100 ms (or 1.5 s) after.
    for idle_ms in [100, 1_500] {
        for &cpu in &cpus {
            policy.forget_flows();
            assert_eq!(answer_on(cpu), TC_ACT_SHOT, "CPU {cpu}: no entry yet");
            b_flow_from(&mut policy, now_ns() - timeout + 30 * MS);
            std::thread::sleep(Duration::from_millis(idle_ms));
            let verdict = answer_on(cpu);
            assert_eq!(verdict, TC_ACT_SHOT, "CPU {cpu} idle {idle_ms} ms: an entry past its timeout passed");
        }
    }
    let answer_key = udp_key(a.ip, b.ip, POLICY_FLOW_KEY_SUBJECT_RECEIVES);
    for &cpu in &cpus {
        b_flow_from(&mut policy, now_ns() + 20 * MS);
        assert_eq!(answer_on(cpu), TC_ACT_REDIRECT, "CPU {cpu}: an entry from a clock ahead of its own was dropped");
        // An entry 300 ms from its timeout, checked a second after the CPU's last check: live,
        // and touched (last seen more than a second ago) with the check's now.
        std::thread::sleep(Duration::from_secs(1));
        b_flow_from(&mut policy, now_ns() - timeout + 300 * MS);
        let before = now_ns();
        assert_eq!(answer_on(cpu), TC_ACT_REDIRECT, "CPU {cpu}: a live entry was dropped");
        let after = now_ns();
        let seen = policy.flows.get(&answer_key, 0).unwrap().last_seen_ns;
        let lag = before.saturating_sub(seen) / MS;
        eprintln!("CPU {cpu}: the check's clock {lag} ms behind CLOCK_MONOTONIC");
        assert!(
            seen <= after && seen + 50 * MS >= before,
            "CPU {cpu}: the check's clock {seen}, not {before}..{after}"
        );
    }
    // Touched on one CPU, read on another after its old last seen would have put it past its
    // timeout.
    if let (Some(&one), Some(&other)) = (cpus.first(), cpus.last()) {
        b_flow_from(&mut policy, now_ns() - timeout + 200 * MS);
        assert_eq!(answer_on(one), TC_ACT_REDIRECT, "CPU {one}: a live entry was dropped");
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(answer_on(other), TC_ACT_REDIRECT, "CPU {other}: the entry CPU {one} kept alive was dropped");
    }
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// A UDP datagram `from` → `to` between the ports given, as `from_pod` gets it from `from`.
fn udp_ports(from: &Attached, to: Ipv4Addr, ports: (u16, u16)) -> Vec<u8> {
    let udp = [&ports.0.to_be_bytes()[..], &ports.1.to_be_bytes(), &12u16.to_be_bytes(), &[0, 0], b"flow"].concat();
    let packet = frames::ipv4(from.ip, to, UDP, &udp);
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), packet].concat())
}

/// One pod opening allowed flows without end has at most `POLICY_NEW_ENTRIES_PER_SECOND`
/// entries remembered per second, and as many at once (a token bucket): the rest still pass
/// (judged packet by packet), and the other pods' entries stay (one pod needs seconds to
/// cycle the LRU at that rate).
#[test]
fn one_pod_opening_flows_without_end_gets_a_bounded_share_of_the_cache() {
    let test = "one_pod_opening_flows_without_end_gets_a_bounded_share_of_the_cache";
    let Some(mut tb) = Testbed::for_test(test, "polbu", "10.222.0.0/24") else { return };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let mut policy = Policy::with_identities(&tb, [(a.ip, A), (b.ip, B), (c.ip, C)]);
    // a and b may send UDP to c, on any port.
    for (pod, id) in [(a, A), (b, B)] {
        policy.subject(pod.ip, id, POLICY_EGRESS_ISOLATED, 0, 1);
        policy.allow(id, C, POLICY_DIRECTION_EGRESS, UDP, None, 2);
    }
    let (verdict, _) = prog_run::run(&tb, "from_pod", &b.host_ifname, udp_ports(b, c.ip, (5000, 53)));
    assert_eq!(verdict, TC_ACT_REDIRECT);
    let b_flows = policy.flows_of(b.ip);
    assert_eq!(b_flows, 2, "b's flow: one entry each way");

    // c is no subject: each of a's flows costs two entries of a's own.
    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    let flood = 2 * entries;
    let frames: Vec<Vec<u8>> = (0..flood).map(|i| udp_ports(a, c.ip, (10_000 + i as u16, 53))).collect();
    let started = Instant::now();
    let verdicts = prog_run::run_each(&tb, "from_pod", &a.host_ifname, frames).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed flow over the budget was dropped");
    let a_flows = policy.flows_of(a.ip);
    // A full bucket, then the rate over the time the flood took (and a little for the clock's tick).
    let budget = entries + (entries as f64 * (elapsed + 0.02)) as usize;
    eprintln!("a: {a_flows} entries after {flood} flows in {elapsed:.2} s (budget {budget})");
    assert!(a_flows <= budget.min(2 * flood), "a has {a_flows} entries after {flood} flows in {elapsed:.2} s");
    assert!(a_flows >= entries - 2, "a's budget was not used: {a_flows}");
    assert!(a_flows < 2 * flood, "the flood was never over the budget: {a_flows} entries");
    assert_eq!(policy.flows_of(b.ip), b_flows, "b's entries went");
    // Over the budget, a's flows are still judged: one to a peer no rule allows is dropped.
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_ports(a, b.ip, (9_999, 53)));
    assert_eq!(verdict, TC_ACT_SHOT, "a → b: no rule");
    drop(policy);
    for pod in 0..3 {
        tb.del(pod).unwrap();
    }
}

/// `POLICY_BUDGETS` (not pinned) of the programs the node loaded, found by name among the maps
/// `from_pod` uses: `budget::Budget`'s six words (when each bucket is full again, when each
/// last refused) by owner.
fn budgets(tb: &Testbed) -> aya::maps::HashMap<aya::maps::MapData, u64, [u64; 6]> {
    use aya::{maps::MapData, programs::SchedClassifier};
    let pin = tb.loaded_version_dir().join("progs").join("from_pod");
    let program = SchedClassifier::from_pin(&pin).unwrap();
    let ids = program.info().unwrap().map_ids().unwrap().unwrap();
    let map = ids
        .into_iter()
        .map(|id| MapData::from_id(id).unwrap())
        .find(|map| map.info().unwrap().name_as_str() == Some("POLICY_BUDGETS"))
        .expect("from_pod uses POLICY_BUDGETS");
    aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(map).unwrap()).unwrap()
}

/// A burst within a tick or a few, when every check on the CPU reads the same kept clock
/// (`clock.rs`): 40,000 SYNs of a's in one test run, back to back in the kernel, each asking
/// for two entries. The bucket gives no more than it holds and the rate over the burst's time:
/// it ends full (when it is full again: at most a second after the burst) and records the
/// refusal at the check's clock, which is CLOCK_MONOTONIC's.
#[test]
fn a_burst_within_a_tick_gets_no_more_than_a_full_bucket() {
    let test = "a_burst_within_a_tick_gets_no_more_than_a_full_bucket";
    let Some(mut tb) = Testbed::for_test(test, "polbt", "10.222.7.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, c) = (&pods[0], &pods[1]);
    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    policy.identity(c.ip, C);
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 0, 1);
    policy.allow(A, C, POLICY_DIRECTION_EGRESS, TCP, None, 2);
    let a_owner = policy.entry(a.ip, A, 0, 0, 0).owner;
    let syn = frames::with_checksums(
        [ethernet(a.host_mac, a.pod_mac, 0x0800), frames::ipv4(a.ip, c.ip, TCP, &frames::tcp(40_000, 80, 0x02))]
            .concat(),
    );
    const SYNS: u32 = 40_000;
    let started = now_ns();
    let (verdict, mean) = prog_run::time(&tb, "from_pod", &a.host_ifname, syn, SYNS).unwrap();
    let ended = now_ns();
    assert_eq!(verdict, TC_ACT_REDIRECT);
    let budget = budgets(&tb).get(&a_owner, 0).expect("a's budget");
    let (full_at, refused_at) = (budget[1], budget[4]);
    const SECOND: u64 = 1_000_000_000;
    let per_entry = SECOND / u64::from(POLICY_NEW_ENTRIES_PER_SECOND);
    let paid = full_at.saturating_sub(started) / per_entry;
    let elapsed = (ended - started) as f64 / 1e9;
    eprintln!(
        "{SYNS} SYNs in {elapsed:.3} s ({mean:?} each): {paid} entries paid, the bucket full again in {} ms",
        (full_at.saturating_sub(ended)) / 1_000_000
    );
    assert!(full_at <= ended + SECOND, "the bucket is full again {} ns after the burst: overdrawn", full_at - ended);
    assert!(full_at + SECOND / 20 >= started + SECOND, "the burst did not empty the bucket: {paid} entries");
    assert!(
        refused_at + SECOND / 20 >= started && refused_at <= ended,
        "the refusal recorded at {refused_at}, not within {started}..{ended}"
    );
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// Flows between two subjects of this node cost one entry each (the pair entry), paid from the
/// opener's egress budget: a flood of them is bounded the same way, and over the budget each
/// flow is still judged by both pods' rules (allowed ones delivered, others dropped).
#[test]
fn a_flood_of_flows_between_two_subjects_is_bounded_and_still_judged() {
    let test = "a_flood_of_flows_between_two_subjects_is_bounded_and_still_judged";
    let Some(mut tb) = Testbed::for_test(test, "polbp", "10.222.3.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, b) = (&pods[0], &pods[1]);
    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    policy.identity(b.ip, B);
    // a may send UDP to b on port 53; b lets UDP from a in, on port 53 only.
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 0, 1);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, UDP, Some(53), 1);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED, 2, 0);
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, Some(53), 2);

    let entries = POLICY_NEW_ENTRIES_PER_SECOND as usize;
    let flood = 2 * entries;
    let frames: Vec<Vec<u8>> = (0..flood).map(|i| udp_ports(a, b.ip, (10_000 + i as u16, 53))).collect();
    let started = Instant::now();
    let verdicts = prog_run::run_each(&tb, "from_pod", &a.host_ifname, frames).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert!(verdicts.iter().all(|v| *v == TC_ACT_REDIRECT), "an allowed flow over the budget was dropped");
    let pairs = pair_keys(&policy).len();
    let budget = entries + (entries as f64 * (elapsed + 0.02)) as usize;
    eprintln!("{pairs} pair entries after {flood} flows in {elapsed:.2} s (budget {budget})");
    assert!(pairs <= budget, "{pairs} pair entries after {flood} flows in {elapsed:.2} s");
    assert!(pairs >= entries - 1, "a's budget was not used: {pairs}");
    assert!(pairs < flood, "the flood was never over the budget");
    assert_eq!(policy.all_flows().len(), pairs, "the pods got entries of their own beside the pair entries");
    // Over the budget: a's egress still judged (b:54, no rule), b's ingress too.
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_ports(a, b.ip, (9_999, 54)));
    assert_eq!(verdict, TC_ACT_SHOT, "a → b:54: no rule");
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, UDP, Some(55), 1);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_ports(a, b.ip, (9_999, 55)));
    assert_eq!(verdict, TC_ACT_SHOT, "a → b:55: b lets it not in");
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_ports(a, b.ip, (9_999, 53)));
    assert_eq!(verdict, TC_ACT_REDIRECT, "a → b:53 over the budget");
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

/// An ICMP error from `from` to `to` (type, code) quoting `quoted` (an IPv4 packet).
fn icmp_error(from: &Attached, to: Ipv4Addr, kind: (u8, u8), quoted: &[u8]) -> Vec<u8> {
    let icmp = [&[kind.0, kind.1, 0, 0, 0, 0, 0x05, 0xdc][..], &quoted[..28]].concat();
    let packet = frames::ipv4(from.ip, to, 1, &icmp);
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), packet].concat())
}

/// ICMP errors about a flow pass where its replies pass: a port unreachable and a
/// fragmentation-needed (PMTU discovery) for the flow a opened reach a (isolated for ingress,
/// nothing allowed in); the same errors about a flow a never opened do not.
#[test]
fn icmp_errors_about_an_allowed_flow_pass_and_no_others() {
    let test = "icmp_errors_about_an_allowed_flow_pass_and_no_others";
    let Some(mut tb) = Testbed::for_test(test, "polic", "10.223.0.0/24") else { return };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let mut policy = Policy::with_identities(&tb, [(a.ip, A), (b.ip, B), (c.ip, C)]);
    policy.subject(a.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    // a's datagram to b: a's flow, remembered by a's egress check (not isolated that way).
    let datagram = udp_ports(a, b.ip, (4000, 53));
    assert_eq!(prog_run::run(&tb, "from_pod", &a.host_ifname, datagram.clone()).0, TC_ACT_REDIRECT);
    let quoted = &datagram[14..];
    for kind in [(3, 3), (3, 4)] {
        let error = icmp_error(b, a.ip, kind, quoted);
        assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, error).0, TC_ACT_REDIRECT, "{kind:?} about a's flow");
    }
    // About a flow a did not open (other ports; a → c): dropped, and nothing remembered.
    let before = policy.all_flows().len();
    let other = udp_ports(a, b.ip, (4001, 53));
    let to_c = udp_ports(a, c.ip, (4000, 53));
    for (from, quoted) in [(b, &other[14..]), (c, &to_c[14..])] {
        let error = icmp_error(from, a.ip, (3, 3), quoted);
        assert_eq!(
            prog_run::run(&tb, "from_pod", &from.host_ifname, error).0,
            TC_ACT_SHOT,
            "an unrelated error passed"
        );
    }
    assert_eq!(policy.all_flows().len(), before, "an ICMP error created state");
    drop(policy);
    for pod in 0..3 {
        tb.del(pod).unwrap();
    }
}

/// The pair entry of a flow between two subjects of this node (`POLICY_FLOW_KEY_PAIR`) vouches
/// for the receiver's ingress only for the two pods it was made for: with another receiver's
/// owner (a new pod at b's address) it is no entry, and b's own rules judge (here: deny).
#[test]
fn a_pair_entry_vouches_only_for_the_pods_it_was_made_for() {
    let test = "a_pair_entry_vouches_only_for_the_pods_it_was_made_for";
    let Some(mut tb) = Testbed::for_test(test, "polpr", "10.225.7.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (a, b) = (&pods[0], &pods[1]);
    let mut policy = Policy::open(&tb);
    policy.identity(a.ip, A);
    policy.identity(b.ip, B);
    // a may send to b; b lets nothing in.
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 0, 2);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, UDP, None, 3);
    policy.subject(b.ip, B, POLICY_INGRESS_ISOLATED, 1, 0);
    let (a_owner, b_owner) = (policy.entry(a.ip, A, 0, 0, 0).owner, policy.entry(b.ip, B, 0, 0, 0).owner);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_frame(a, b));
    assert_eq!(verdict, TC_ACT_SHOT, "b's ingress let a in");
    assert!(pair_keys(&policy).is_empty(), "a denied flow got a pair entry");

    // Pair entries (both orientations) of another b: no entry.
    let pair = |owner| PolicyFlow { last_seen_ns: now_ns(), owner, slot: 0, flags: 0 };
    let forge = |policy: &mut Policy, owner| {
        for key in [udp_key(a.ip, b.ip, POLICY_FLOW_KEY_PAIR), udp_key(b.ip, a.ip, POLICY_FLOW_KEY_PAIR)] {
            policy.flows.insert(key, pair(owner), 0).unwrap();
        }
    };
    forge(&mut policy, a_owner ^ b_owner ^ 0x5a5a);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_frame(a, b));
    assert_eq!(verdict, TC_ACT_SHOT, "a pair entry of another receiver vouched for b");
    // The same entries as these two pods' own: they vouch (b's rules are not asked).
    forge(&mut policy, a_owner ^ b_owner);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_frame(a, b));
    assert_eq!(verdict, TC_ACT_REDIRECT, "the pair entry is not what the check reads");

    // An allowed flow gets one pair entry, which the reply finds.
    policy.forget_flows();
    policy.allow(B, A, POLICY_DIRECTION_INGRESS, UDP, None, 4);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_frame(a, b));
    assert_eq!(verdict, TC_ACT_REDIRECT, "an allowed flow was dropped");
    assert_eq!(pair_keys(&policy).len(), 1, "one pair entry per flow");
    assert_eq!(policy.all_flows().len(), 1, "the pods got entries of their own beside the pair entry");
    let (verdict, _) = prog_run::run(&tb, "from_pod", &b.host_ifname, udp_frame(b, a));
    assert_eq!(verdict, TC_ACT_REDIRECT, "the reply was dropped");
    assert_eq!(pair_keys(&policy).len(), 1, "the reply made a pair entry of its own");
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}

fn pair_keys(policy: &Policy) -> Vec<FlowKey> {
    policy.all_flows().into_iter().filter(|k| k.pad[0] == POLICY_FLOW_KEY_PAIR).collect()
}

/// A dual-stack pod of `tb` after ADD: its IPv6 address, host veth, and the veth pair's MACs.
struct Pod6 {
    ip: Ipv6Addr,
    host_ifname: String,
    host_mac: [u8; 6],
    pod_mac: [u8; 6],
}

fn add_pods6(tb: &mut Testbed, subnets: [&str; 2], count: usize) -> Vec<Pod6> {
    let ranges: Vec<serde_json::Value> = subnets.iter().map(|s| json!([{ "subnet": s }])).collect();
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    let mac = |v: &serde_json::Value| -> [u8; 6] {
        let bytes: Vec<u8> = v.as_str().unwrap().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        bytes.try_into().unwrap()
    };
    (0..count)
        .map(|_| {
            let pod = tb.new_pod().unwrap();
            let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
            assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
            let r = out.json();
            Pod6 {
                ip: r["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap(),
                host_ifname: r["interfaces"][0]["name"].as_str().unwrap().to_string(),
                host_mac: mac(&r["interfaces"][0]["mac"]),
                pod_mac: mac(&r["interfaces"][1]["mac"]),
            }
        })
        .collect()
}

/// A UDP datagram `from` → `to` between the ports given, as `from_pod` gets it from `from`.
fn udp6(from: &Pod6, to: Ipv6Addr, ports: (u16, u16)) -> Vec<u8> {
    let udp = [&ports.0.to_be_bytes()[..], &ports.1.to_be_bytes(), &12u16.to_be_bytes(), &[0, 0], b"flow"].concat();
    [ethernet(from.host_mac, from.pod_mac, 0x86dd), frames::ipv6(from.ip, to, UDP, &udp)].concat()
}

/// An ICMPv6 error from `from` to `to` (type, code) quoting `quoted` (an IPv6 packet).
fn icmp6_error(from: &Pod6, to: Ipv6Addr, kind: (u8, u8), quoted: &[u8]) -> Vec<u8> {
    let message = [&[kind.0, kind.1, 0, 0, 0, 0, 0x05, 0x00][..], quoted].concat();
    [ethernet(from.host_mac, from.pod_mac, 0x86dd), frames::ipv6_icmp(from.ip, to, &message)].concat()
}

/// The IPv6 side of [`icmp_errors_about_an_allowed_flow_pass_and_no_others`]: a packet too big
/// and a port unreachable about the flow a opened reach a (isolated for ingress, nothing
/// allowed in); the same errors about a flow a never opened do not, and create nothing.
#[test]
fn icmpv6_errors_about_an_allowed_flow_pass_and_no_others() {
    let test = "icmpv6_errors_about_an_allowed_flow_pass_and_no_others";
    let Some(mut tb) = Testbed::for_test(test, "polic6", "10.236.0.0/24") else { return };
    let pods = add_pods6(&mut tb, ["10.236.0.0/24", "fd00:10:236::/64"], 3);
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let mut policy = Policy::with_identities(&tb, [(a.ip, A), (b.ip, B), (c.ip, C)]);
    policy.subject(a.ip, A, POLICY_INGRESS_ISOLATED, 1, 0);
    // a's datagram to b: a's flow, remembered by a's egress check (not isolated that way).
    let datagram = udp6(a, b.ip, (4000, 53));
    assert_eq!(prog_run::run(&tb, "from_pod", &a.host_ifname, datagram.clone()).0, TC_ACT_REDIRECT);
    let quoted = &datagram[14..];
    for kind in [(2, 0), (1, 4)] {
        let error = icmp6_error(b, a.ip, kind, quoted);
        assert_eq!(prog_run::run(&tb, "from_pod", &b.host_ifname, error).0, TC_ACT_REDIRECT, "{kind:?} about a's flow");
    }
    // About a flow a did not open (other ports; a → c): dropped, and nothing remembered.
    let before = policy.all_flows().len();
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    let other = udp6(a, b.ip, (4001, 53));
    let to_c = udp6(a, c.ip, (4000, 53));
    for (from, quoted) in [(b, &other[14..]), (c, &to_c[14..])] {
        let error = icmp6_error(from, a.ip, (2, 0), quoted);
        let verdict = prog_run::run(&tb, "from_pod", &from.host_ifname, error).0;
        assert_eq!(verdict, TC_ACT_SHOT, "an unrelated packet too big passed");
    }
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 2);
    assert_eq!(policy.all_flows().len(), before, "an ICMPv6 error created state");
    drop(policy);
    for pod in 0..3 {
        tb.del(pod).unwrap();
    }
}

/// The IPv6 path of `from_pod` makes the pair check's two calls too (the pair lookup, then the
/// sender's check when it misses): b's ICMPv6 port unreachable to a, two subjects of this node,
/// about a's datagram before the flow has its pair entry is judged as itself (ICMPv6, no ports)
/// by b's egress, never as the flow it quotes, whose reply b's rules allow: dropped, on the same
/// CPU right after a packet whose pair lookup hit. Once a's datagram made the flow's pair entry,
/// the same error, and b's reply, ride it.
#[test]
fn icmpv6_errors_between_two_subjects_ride_the_pair_entry_or_are_judged_as_themselves() {
    let test = "icmpv6_errors_between_two_subjects_ride_the_pair_entry_or_are_judged_as_themselves";
    let Some(mut tb) = Testbed::for_test(test, "polpe6", "10.236.1.0/24") else { return };
    let pods = add_pods6(&mut tb, ["10.236.1.0/24", "fd00:10:236:1::/64"], 3);
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let mut policy = Policy::with_identities(&tb, [(a.ip, A), (b.ip, B), (c.ip, C)]);
    let cpu = prog_run::cpus()[0];
    let run = |from: &Pod6, frame| prog_run::run_on_cpu(&tb, cpu, "from_pod", &from.host_ifname, frame).0;
    // a may send UDP to port 53 (its ingress is open); b to port 4000 and nothing else.
    policy.subject(a.ip, A, POLICY_EGRESS_ISOLATED, 1, 1);
    policy.allow(A, B, POLICY_DIRECTION_EGRESS, UDP, Some(53), 1);
    policy.allow(A, C, POLICY_DIRECTION_EGRESS, UDP, Some(53), 1);
    policy.subject(b.ip, B, POLICY_EGRESS_ISOLATED, 2, 2);
    policy.allow(B, A, POLICY_DIRECTION_EGRESS, UDP, Some(4000), 2);
    policy.subject(c.ip, C, POLICY_INGRESS_ISOLATED, 3, 3);
    policy.allow(C, A, POLICY_DIRECTION_INGRESS, UDP, Some(53), 3);
    let datagram = udp6(a, b.ip, (4000, 53));
    let error = icmp6_error(b, a.ip, (1, 4), &datagram[14..]);
    // a's datagram to c makes a pair entry, and its next one rides it (the lookup hits).
    let to_c = udp6(a, c.ip, (4000, 53));
    assert_eq!(run(a, to_c.clone()), TC_ACT_REDIRECT, "a's datagram to c");
    assert_eq!(pair_keys(&policy).len(), 1, "a's flow to c has no pair entry");
    assert_eq!(run(a, to_c), TC_ACT_REDIRECT, "a's datagram to c on its pair entry");
    let denied = tb.drops(DropReason::PolicyDenied).unwrap();
    assert_eq!(run(b, error.clone()), TC_ACT_SHOT, "an error about no flow passed as the flow it quotes");
    assert_eq!(tb.drops(DropReason::PolicyDenied).unwrap(), denied + 1);
    assert_eq!(pair_keys(&policy).len(), 1, "a denied error left a pair entry");

    assert_eq!(run(a, datagram), TC_ACT_REDIRECT, "a's datagram to b");
    assert_eq!(pair_keys(&policy).len(), 2, "a's flow to b has no pair entry");
    assert_eq!(run(b, error), TC_ACT_REDIRECT, "the error about a's flow, on its pair entry");
    assert_eq!(run(b, udp6(b, a.ip, (53, 4000))), TC_ACT_REDIRECT, "b's reply to a");
    assert_eq!(pair_keys(&policy).len(), 2, "the error or the reply wrote a pair entry");
    drop(policy);
    for pod in 0..3 {
        tb.del(pod).unwrap();
    }
}
