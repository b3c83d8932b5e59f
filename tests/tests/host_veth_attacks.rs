//! Attacks on `HOST_VETHS`, the slot (ifindex mod 4,096) where `from_pod` finds a packet's
//! sender before `ENDPOINTS`: two live host veths whose ifindexes share a slot (the node's
//! ifindex counter pushed by IFB links), one of them egress-limited; and a slot left behind by
//! a DEL that found no endpoint of its pod, which must not vouch for whatever interface later
//! gets that ifindex.
use ebpf_cni_tests::{
    Attached, Testbed,
    frames::{self, ethernet},
    prog_run::{self, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC},
    run_in,
};
use ebpf_common::HOST_VETHS_SLOTS;
use serde_json::{Value, json};

fn ifindex(tb: &Testbed, ifname: &str) -> u64 {
    let out = run_in(&tb.node.name, "ip", &["-j", "link", "show", "dev", ifname]).unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["ifindex"].as_u64().unwrap()
}

fn udp_from(from: &Attached, src: std::net::Ipv4Addr, to: &Attached) -> Vec<u8> {
    let datagram = frames::ipv4_udp(src, to.ip, b"who sent this");
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), datagram].concat())
}

/// ADD with `conf` that must succeed; what the programs know of the pod.
fn add_with(tb: &Testbed, pod: usize, conf: &Value) -> Attached {
    let out = tb.cni("ADD", pod, conf).unwrap();
    assert!(out.success, "ADD: {} {}", out.stdout, out.stderr);
    let result = out.json();
    let mac = |v: &Value| -> [u8; 6] {
        let bytes: Vec<u8> = v.as_str().unwrap().split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        bytes.try_into().unwrap()
    };
    Attached {
        ip: result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap(),
        pod_mac: mac(&result["interfaces"][1]["mac"]),
        host_mac: mac(&result["interfaces"][0]["mac"]),
        host_ifname: result["interfaces"][0]["name"].as_str().unwrap().to_string(),
    }
}

/// Advances the node's ifindex counter so that the next link it creates gets `target`: IFBs
/// made, then deleted together (one by one, each costs the kernel a grace period).
fn push_ifindex_counter_to(tb: &Testbed, target: u64) {
    let group = "4242";
    run_in(&tb.node.name, "ip", &["link", "add", "hvprobe", "group", group, "type", "ifb"]).unwrap();
    let probe = ifindex(tb, "hvprobe");
    assert!(probe < target, "the counter is past {target} already ({probe})");
    let batch: String = (probe + 1..target).map(|i| format!("link add hvpush{i} group {group} type ifb\n")).collect();
    let file = std::env::temp_dir().join(format!("hv-push-{}", tb.run_id));
    std::fs::write(&file, batch).unwrap();
    let out = run_in(&tb.node.name, "ip", &["-batch", file.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "ip -batch: {}", String::from_utf8_lossy(&out.stderr));
    run_in(&tb.node.name, "ip", &["link", "del", "group", group]).unwrap();
}

/// Two live host veths in one slot, the first egress-limited: the later ADD takes the slot, the
/// first pod's packets take `ENDPOINTS` with its own flags (still handed to its egress limit),
/// neither pod can send from the other's address, and the first pod's DEL leaves the second's
/// slot.
#[test]
fn colliding_host_veths_keep_their_own_sender_and_egress_limit() {
    let test = "colliding_host_veths_keep_their_own_sender_and_egress_limit";
    let Some(mut tb) = Testbed::for_test(test, "hx", "10.215.0.0/24") else { return };
    let plain = tb.add_attachments(1).unwrap().remove(0);
    let mut limited_conf = tb.conf("1.0.0");
    limited_conf["capabilities"] = json!({ "bandwidth": true });
    limited_conf["runtimeConfig"] =
        json!({ "bandwidth": { "egressRate": 100_000_000u64, "egressBurst": 1_000_000u64 } });
    let limited_pod = tb.new_pod().unwrap();
    let limited = add_with(&tb, limited_pod, &limited_conf);
    let limited_index = ifindex(&tb, &limited.host_ifname);

    // An egress-limited pod's packets are left to the next filter (the IFB's), never redirected.
    let (shaped, _) = prog_run::run(&tb, "from_pod", &limited.host_ifname, udp_from(&limited, limited.ip, &plain));
    assert_eq!(shaped, TC_ACT_UNSPEC, "the limited pod's packet was not left to its limit");

    push_ifindex_counter_to(&tb, limited_index + u64::from(HOST_VETHS_SLOTS));
    let taker = tb.add_attachments(1).unwrap().remove(0);
    let taker_index = ifindex(&tb, &taker.host_ifname);
    assert_eq!(taker_index, limited_index + u64::from(HOST_VETHS_SLOTS), "no collision was made");
    let held = tb.host_veth_slots();
    assert!(held.iter().any(|s| s.0 == taker_index), "the later ADD did not take the slot: {held:?}");
    assert!(!held.iter().any(|s| s.0 == limited_index), "two veths in one slot: {held:?}");

    // The displaced pod: still its own sender, still limited; the taker: its own, unlimited.
    let (verdict, _) = prog_run::run(&tb, "from_pod", &limited.host_ifname, udp_from(&limited, limited.ip, &plain));
    assert_eq!(verdict, TC_ACT_UNSPEC, "the displaced pod escaped its egress limit");
    let (verdict, _) = prog_run::run(&tb, "from_pod", &taker.host_ifname, udp_from(&taker, taker.ip, &plain));
    assert_eq!(verdict, TC_ACT_REDIRECT, "the slot's pod lost its fast path");
    // Each from the other's address: dropped.
    let (verdict, _) = prog_run::run(&tb, "from_pod", &limited.host_ifname, udp_from(&limited, taker.ip, &plain));
    assert_eq!(verdict, TC_ACT_SHOT, "the displaced pod sent as the slot's pod");
    let (verdict, _) = prog_run::run(&tb, "from_pod", &taker.host_ifname, udp_from(&taker, limited.ip, &plain));
    assert_eq!(verdict, TC_ACT_SHOT, "the slot's pod sent as the displaced one");
    // And an egress-limited pod on the slot keeps its flag (the taker sends from the limited
    // pod's address above only as a spoof; its own flags are its own).
    assert!(held.iter().filter(|s| s.0 == taker_index).all(|s| s.2 == 0), "{held:?}");

    // The displaced pod's DEL leaves the taker's slot; the taker's clears it.
    tb.del(limited_pod).unwrap();
    assert!(tb.host_veth_slots().iter().any(|s| s.0 == taker_index), "the displaced pod's DEL freed another's slot");
    let (verdict, _) = prog_run::run(&tb, "from_pod", &taker.host_ifname, udp_from(&taker, taker.ip, &plain));
    assert_eq!(verdict, TC_ACT_REDIRECT);
    tb.del(2).unwrap();
    assert!(!tb.host_veth_slots().iter().any(|s| s.0 == taker_index), "DEL left the taker's slot");
    tb.del(0).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// A DEL that finds none of its pod's endpoints (an ADD killed between claiming the slot and
/// writing them, or entries removed by another hand) still frees the slot of the host veth it
/// deletes. Left behind, the slot vouches for the gone pod's address on any interface that
/// later gets that ifindex (a link created with `index`, or moved into the node's namespace,
/// keeps the number it asks for), though the address may be another pod's by then.
#[test]
fn a_slot_whose_endpoints_are_gone_goes_with_its_veth() {
    let test = "a_slot_whose_endpoints_are_gone_goes_with_its_veth";
    let Some(mut tb) = Testbed::for_test(test, "hy", "10.216.0.0/24") else { return };
    let pods = tb.add_attachments(2).unwrap();
    let (gone, peer) = (&pods[0], &pods[1]);
    let gone_index = ifindex(&tb, &gone.host_ifname);

    // Its endpoint removed without its slot.
    tb.remove_endpoint(gone.ip);
    tb.del(0).unwrap();
    let held = tb.host_veth_slots();
    assert!(!held.iter().any(|s| s.0 == gone_index), "DEL left the slot of the veth it deleted: {held:?}");

    // An interface with the old ifindex sending from the gone pod's address: not vouched for.
    let index = gone_index.to_string();
    run_in(&tb.node.name, "ip", &["link", "add", "hvreuse", "index", &index, "type", "ifb"]).unwrap();
    let (verdict, _) = prog_run::run(&tb, "from_pod", "hvreuse", udp_from(gone, gone.ip, peer));
    let _ = run_in(&tb.node.name, "ip", &["link", "del", "hvreuse"]);
    assert_eq!(verdict, TC_ACT_SHOT, "a stale slot vouched for an address on a reused ifindex");
    tb.del(1).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
