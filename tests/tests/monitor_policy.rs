//! `ebpf-cni monitor` and NetworkPolicy: a flow the policy maps deny into a pod shows as one
//! `denied` event (not also as a drop), with its direction, pod, peer, ports and the policy slot
//! it was counted on, named from the names file; an allowed new flow as one `allowed` event. The
//! maps are written straight from the test, as the agent would write them (`policy_datapath.rs`).
use std::{net::IpAddr, path::Path, time::Duration};

use aya::maps::{
    Array, HashMap, Map, MapData,
    lpm_trie::{Key, LpmTrie},
};
use ebpf_cni_tests::{
    Testbed,
    frames::{ethernet, ipv4, tcp, with_checksums},
    monitor::MonitorRun,
    run_in,
    traffic::PacketSocket,
};
use ebpf_common::{
    Endpoint, IDENTITY_WORLD, IpKey, POLICY_DIRECTION_INGRESS, POLICY_INGRESS_ISOLATED, POLICY_RULE_FULL_BITS,
    PolicyEndpoint, PolicyIdentity, PolicyRule, PolicyRuleKey, host_veth_slot, identity_prefix_len, names,
};
use serde_json::json;

const A: u32 = 300;
const B: u32 = 301;
const TCP: u8 = 6;
const SYN: u8 = 0x02;

fn open(tb: &Testbed, name: &str) -> Map {
    Map::from_map_data(MapData::from_pin(Path::new(&tb.map_pin(name))).unwrap()).unwrap()
}

fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

#[test]
fn a_denied_and_an_allowed_flow_show_with_their_policy() {
    let test = "a_denied_and_an_allowed_flow_show_with_their_policy";
    let Some(mut tb) = Testbed::for_test(test, "monpol", "10.198.0.0/24") else { return };
    // IPv6 off in the pods before their interface arrives: their own chatter (DAD, MLD) would be
    // judged and shown too. The node's side (the host veth's MLD reports into b, judged and
    // denied at b's ingress) is left out by `--pod x/a`.
    for _ in 0..2 {
        let pod = tb.new_pod().unwrap();
        for conf in ["all", "default"] {
            let setting = format!("net.ipv6.conf.{conf}.disable_ipv6=1");
            run_in(&tb.pods[pod].netns.name, "sysctl", &["-qw", &setting]).unwrap();
        }
    }
    let (a, b) = (tb.add_attachment(0).unwrap(), tb.add_attachment(1).unwrap());
    // b is ingress isolated (denials counted on slot 7); a may open TCP 81 to it (slot 8).
    let mut identities: LpmTrie<_, IpKey, PolicyIdentity> =
        LpmTrie::try_from(open(&tb, names::POLICY_IDENTITIES)).unwrap();
    let world = Key::new(identity_prefix_len(0), ip_key(IpAddr::from([0, 0, 0, 0])));
    identities.insert(&world, PolicyIdentity { identity: IDENTITY_WORLD, pad: 0 }, 0).unwrap();
    for (pod, id) in [(&a, A), (&b, B)] {
        let key = Key::new(identity_prefix_len(32), ip_key(IpAddr::V4(pod.ip)));
        identities.insert(&key, PolicyIdentity { identity: id, pad: 0 }, 0).unwrap();
    }
    let endpoints: HashMap<_, IpKey, Endpoint> = HashMap::try_from(open(&tb, names::ENDPOINTS)).unwrap();
    let ep = endpoints.get(&ip_key(IpAddr::V4(b.ip)), 0).unwrap();
    let mut subjects: Array<_, PolicyEndpoint> = Array::try_from(open(&tb, names::POLICY_ENDPOINTS)).unwrap();
    let subject = PolicyEndpoint {
        ifindex: ep.host_ifindex,
        flags: POLICY_INGRESS_ISOLATED,
        owner: ep.owner,
        identity: B,
        ingress_slot: 7,
        egress_slot: 0,
        pad: 0,
    };
    subjects.set(host_veth_slot(ep.host_ifindex), subject, 0).unwrap();
    let mut rules: LpmTrie<_, PolicyRuleKey, PolicyRule> = LpmTrie::try_from(open(&tb, names::POLICY_RULES)).unwrap();
    let rule = PolicyRuleKey {
        subject: B,
        peer: A,
        direction: POLICY_DIRECTION_INGRESS,
        protocol: TCP,
        port_be: 81u16.to_be_bytes(),
    };
    rules.insert(&Key::new(POLICY_RULE_FULL_BITS, rule), PolicyRule { slot: 8, pad: 0 }, 0).unwrap();

    let names_file = tb.data_dir().join("policy-names.json");
    let file = json!({
        "policies": {"7": "y/default-deny", "8": "y/allow-81"},
        "identities": {},
        "pods": {a.ip.to_string(): "x/a", b.ip.to_string(): "y/b"},
    });
    std::fs::write(&names_file, file.to_string()).unwrap();
    let monitor = MonitorRun::start(
        &tb,
        &["--policy-names", names_file.to_str().unwrap(), "-o", "json", "--count", "2", "--pod", "x/a"],
    )
    .unwrap();
    let socket = PacketSocket::open(&tb.pods[0].netns.name, "eth0").unwrap();
    for port in [80, 81] {
        let syn =
            [ethernet(a.host_mac, a.pod_mac, 0x0800), ipv4(a.ip, b.ip, TCP, &tcp(40000 + port, port, SYN))].concat();
        socket.send(&with_checksums(syn)).unwrap();
    }
    let done = monitor.finish(Duration::from_secs(10)).unwrap();
    let events = done.events();
    assert_eq!(events.len(), 2, "{events:#?} {}", done.stderr);
    let expect = |port: u16, verdict: &str, reason, policy: &str, slot: u32| {
        let event = events
            .iter()
            .find(|e| e["dst_port"] == port)
            .unwrap_or_else(|| panic!("no event for port {port}: {events:#?}"));
        let expected = json!({
            "type": "policy", "verdict": verdict, "reason": reason, "direction": "ingress",
            "pod": "y/b", "pod_ip": b.ip.to_string(), "peer": "x/a", "peer_ip": a.ip.to_string(),
            "protocol": "tcp", "src_port": 40000 + port, "policy": policy, "policy_slot": slot,
        });
        for (field, value) in expected.as_object().unwrap() {
            assert_eq!(&event[field], value, "{field} of {event:#}");
        }
        eprintln!("{}", serde_json::to_string(event).unwrap());
    };
    expect(80, "denied", json!("policy-denied"), "y/default-deny", 7);
    expect(81, "allowed", json!(null), "y/allow-81", 8);

    // The same as a table: new flows (other source ports), a header and a line each.
    let monitor =
        MonitorRun::start(&tb, &["--policy-names", names_file.to_str().unwrap(), "--count", "2", "--pod", "x/a"])
            .unwrap();
    for port in [80, 81] {
        let syn =
            [ethernet(a.host_mac, a.pod_mac, 0x0800), ipv4(a.ip, b.ip, TCP, &tcp(50000 + port, port, SYN))].concat();
        socket.send(&with_checksums(syn)).unwrap();
    }
    let done = monitor.finish(Duration::from_secs(10)).unwrap();
    assert_eq!(done.lines.len(), 3, "{:?}", done.lines);
    let denied: Vec<&str> = done.lines.iter().find(|l| l.contains("denied")).unwrap().split_whitespace().collect();
    assert_eq!(&denied[1..], ["y/b", "ingress", "x/a", "tcp", "50080→80", "denied", "policy-denied", "y/default-deny"]);
    eprintln!("{}", done.lines.join("\n"));
}
