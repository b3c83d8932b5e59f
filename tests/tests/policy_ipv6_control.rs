//! NetworkPolicy leaves IPv6's link control alone: neighbour discovery (ICMPv6 133–137, hop
//! limit 255) and MLD (130–132, 143, hop limit 1, behind a Hop-by-Hop header) go into and out
//! of a pod isolated both ways, and are never counted as denied; a TCP flow still is, and an
//! "MLD" or "solicitation" with another hop limit is judged like any packet.
use std::{
    net::{Ipv6Addr, SocketAddrV6, UdpSocket},
    time::Duration,
};

use ebpf_cni_tests::{
    Testbed,
    frames::ethernet,
    policy_maps::{A, B, Policy},
    probe::{self, Servers},
    prog_run::{self, TC_ACT_SHOT},
    run_in,
    traffic::in_netns,
};
use ebpf_common::{DropReason, POLICY_EGRESS_ISOLATED, POLICY_INGRESS_ISOLATED};
use serde_json::{Value, json};

const V4_SUBNET: &str = "10.226.0.0/24";
const V6_SUBNET: &str = "fd00:10:226::/64";
/// A link-scope group some listener joins (MLD reports for it follow).
const GROUP: &str = "ff02::1:3";

fn mac(v: &Value) -> [u8; 6] {
    let bytes: Vec<u8> = v.as_str().unwrap().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    bytes.try_into().unwrap()
}

fn link_local(mac: [u8; 6]) -> Ipv6Addr {
    let [a, b, c, d, e, f] = mac;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, a ^ 2, b, c, 0xff, 0xfe, d, e, f])
}

/// An IPv6 packet `src` → `dst` with `hop_limit` carrying `payload` after `next_header`
/// (checksums left 0: the policy check reads no checksum).
fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u16).to_be_bytes();
    [&[0x60, 0, 0, 0][..], &len, &[next_header, hop_limit], &src.octets(), &dst.octets(), payload].concat()
}

/// An MLDv2 report (type 143) for [`GROUP`] behind a Hop-by-Hop header with a router alert, as
/// the kernel sends it.
fn mld_report(src: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let hop_by_hop = [58, 0, 5, 2, 0, 0, 1, 0];
    let group: Ipv6Addr = GROUP.parse().unwrap();
    let report = [&[143, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0][..], &group.octets()].concat();
    ipv6(src, "ff02::16".parse().unwrap(), 0, hop_limit, &[&hop_by_hop[..], &report].concat())
}

/// A neighbour solicitation for `target` (type 135).
fn solicitation(src: Ipv6Addr, target: Ipv6Addr, hop_limit: u8) -> Vec<u8> {
    let message = [&[135, 0, 0, 0, 0, 0, 0, 0][..], &target.octets()].concat();
    ipv6(src, target, 58, hop_limit, &message)
}

/// A socket in `netns` that joined [`GROUP`] on interface `ifindex` (the kernel reports it).
fn join(netns: &str, ifindex: u32) -> UdpSocket {
    in_netns(netns, move || {
        let socket = UdpSocket::bind("[::]:0")?;
        socket.join_multicast_v6(&GROUP.parse()?, ifindex)?;
        Ok(socket)
    })
    .unwrap()
}

fn ifindex(netns: &str, ifname: &str) -> u32 {
    let out = run_in(netns, "ip", &["-j", "link", "show", "dev", ifname]).unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["ifindex"].as_u64().unwrap() as u32
}

#[test]
fn neighbour_discovery_and_mld_pass_an_isolated_pod_uncounted() {
    let test = "neighbour_discovery_and_mld_pass_an_isolated_pod_uncounted";
    let Some(mut tb) = Testbed::for_test(test, "pol6c", V4_SUBNET) else { return };
    let ranges: Vec<Value> = [V4_SUBNET, V6_SUBNET].iter().map(|s| json!([{ "subnet": s }])).collect();
    tb.extra.insert("ipam".into(), json!({ "type": "host-local", "ranges": ranges, "dataDir": tb.data_dir() }));
    let mut results = Vec::new();
    for _ in 0..2 {
        let pod = tb.new_pod().unwrap();
        let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
        assert!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
        results.push(out.json());
    }
    let v6: Vec<Ipv6Addr> = results
        .iter()
        .map(|r| r["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap())
        .collect();
    let gateway = results[1]["ips"][1]["gateway"].as_str().unwrap().to_string();
    let (b_host_veth, b_host_mac, b_mac) = (
        results[1]["interfaces"][0]["name"].as_str().unwrap().to_string(),
        mac(&results[1]["interfaces"][0]["mac"]),
        mac(&results[1]["interfaces"][1]["mac"]),
    );
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    for name in &ns {
        let _ = run_in(name, "sysctl", &["-qw", "net.ipv6.conf.all.accept_dad=0"]);
    }
    std::thread::sleep(Duration::from_secs(2));
    let mut servers = Servers::default();
    servers.tcp(&ns[0], SocketAddrV6::new(v6[0], 8080, 0, 0)).unwrap();

    // b lets nothing in and nothing out.
    let mut policy = Policy::open(&tb);
    policy.identity(v6[0], A);
    policy.identity(v6[1], B);
    policy.subject(v6[1], B, POLICY_INGRESS_ISOLATED | POLICY_EGRESS_ISOLATED, 1, 1);
    let denied = || tb.drops(DropReason::PolicyDenied).unwrap();
    let before = denied();

    // The node's kernel reports a group on b's host veth (into b), b's on its interface (out).
    let node_joined = join(&tb.node.name, ifindex(&tb.node.name, &b_host_veth));
    let pod_joined = join(&ns[1], ifindex(&ns[1], "eth0"));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(denied(), before, "MLD reports (joins) counted as policy-denied");
    // b forgets its gateway's link address and solicits it again with its next packet: a TCP
    // flow to a, which its policy denies (counted), after the solicitation passed.
    let _ = run_in(&ns[1], "ip", &["-6", "neigh", "del", &gateway, "dev", "eth0"]);
    assert!(probe::ask_tcp(&ns[1], SocketAddrV6::new(v6[0], 8080, 0, 0)).is_err(), "b → a: denied");
    let neighbour = run_in(&ns[1], "ip", &["-6", "neigh", "show", &gateway, "dev", "eth0"]).unwrap();
    let neighbour = String::from_utf8_lossy(&neighbour.stdout).to_string();
    assert!(neighbour.contains("lladdr"), "b did not resolve its gateway: {neighbour:?}");
    let after_tcp = denied();
    assert!(after_tcp > before, "the denied TCP flow was not counted");
    drop((node_joined, pod_joined));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(denied(), after_tcp, "MLD reports (leaves) or neighbour discovery counted as policy-denied");

    // Crafted, into b through `to_pod`: an MLD report behind its Hop-by-Hop header and a
    // solicitation pass uncounted; with a hop limit no receiver accepts, they are judged.
    let node_link_local = link_local(b_host_mac);
    let frame = |dst_mac: [u8; 6], packet: Vec<u8>| [ethernet(dst_mac, b_host_mac, 0x86dd), packet].concat();
    let mld_mac = [0x33, 0x33, 0, 0, 0, 0x16];
    let cases = [
        ("MLD report", frame(mld_mac, mld_report(node_link_local, 1)), false),
        ("solicitation", frame(b_mac, solicitation(node_link_local, v6[1], 255)), false),
        ("MLD report, hop limit 64", frame(mld_mac, mld_report(node_link_local, 64)), true),
        ("solicitation, hop limit 64", frame(b_mac, solicitation(node_link_local, v6[1], 64)), true),
    ];
    for (what, frame, judged) in cases {
        let counted = denied();
        let (verdict, _) = prog_run::run(&tb, "to_pod", &b_host_veth, frame);
        assert_eq!(verdict == TC_ACT_SHOT, judged, "{what}: verdict {verdict}");
        assert_eq!(denied() - counted, u64::from(judged), "{what}: counted");
    }
    assert_eq!(policy.flows_of(v6[1]), 0, "link control or a denied flow left state");
    drop(servers);
    drop(policy);
    for pod in 0..2 {
        tb.del(pod).unwrap();
    }
}
