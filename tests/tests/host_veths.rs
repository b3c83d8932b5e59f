//! `HOST_VETHS`: `from_pod` finds a packet's sender by its host veth's slot before it looks the
//! source address up in `ENDPOINTS`. ADD fills the slot, DEL and GC clear it, and the slot
//! never lets a spoofed source through.
use ebpf_cni_tests::{
    Attached, Testbed,
    frames::{self, ethernet},
    prog_run::{self, TC_ACT_REDIRECT, TC_ACT_SHOT},
};
use ebpf_common::DropReason;
use serde_json::Value;

/// The slots in use, as (ifindex, IPv4 address).
fn slots(tb: &Testbed) -> Vec<(u64, [u8; 4])> {
    tb.host_veth_slots().into_iter().map(|(ifindex, ip, _)| (ifindex, ip)).collect()
}

fn ifindex(tb: &Testbed, ifname: &str) -> u64 {
    let out = ebpf_cni_tests::run_in(&tb.node.name, "ip", &["-j", "link", "show", "dev", ifname]).unwrap();
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    links[0]["ifindex"].as_u64().unwrap()
}

fn udp_from(from: &Attached, src: std::net::Ipv4Addr, to: &Attached) -> Vec<u8> {
    let datagram = frames::ipv4_udp(src, to.ip, b"who sent this");
    frames::with_checksums([ethernet(from.host_mac, from.pod_mac, 0x0800), datagram].concat())
}

#[test]
fn the_host_veths_slot_vouches_for_its_pod_only_and_goes_with_it() {
    let test = "the_host_veths_slot_vouches_for_its_pod_only_and_goes_with_it";
    let Some(mut tb) = Testbed::for_test(test, "hv", "10.214.0.0/24") else { return };
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);
    let held = slots(&tb);
    for pod in &pods {
        let want = (ifindex(&tb, &pod.host_ifname), pod.ip.octets());
        assert!(held.contains(&want), "no slot {want:?} for {} in {held:?}", pod.host_ifname);
    }

    // Its own address from its own veth: delivered; another pod's: dropped, counted.
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_from(a, a.ip, b));
    assert_eq!(verdict, TC_ACT_REDIRECT);
    let spoofed = tb.drops(DropReason::SpoofedSource).unwrap();
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_from(a, c.ip, b));
    assert_eq!(verdict, TC_ACT_SHOT, "another pod's address passed as the sender's");
    assert_eq!(tb.drops(DropReason::SpoofedSource).unwrap(), spoofed + 1);
    // The unspecified address matches no slot (an empty address in one means none there).
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_from(a, std::net::Ipv4Addr::UNSPECIFIED, b));
    assert_eq!(verdict, TC_ACT_SHOT, "0.0.0.0 passed as the sender's");

    // Without its `ENDPOINTS` entry the pod's packets still pass on the slot alone: the slot
    // is what from_pod reads first.
    tb.remove_endpoint(a.ip);
    let (verdict, _) = prog_run::run(&tb, "from_pod", &a.host_ifname, udp_from(a, a.ip, b));
    assert_eq!(verdict, TC_ACT_REDIRECT, "the slot was not used");

    // DEL clears the pod's slot (b's: its endpoints are there); GC the one whose endpoints
    // went without it (a's, as after an ADD that failed between the two).
    tb.del(1).unwrap();
    let b_slot = (ifindex_gone(&held, b), b.ip.octets());
    assert!(!slots(&tb).contains(&b_slot), "DEL left b's slot");
    assert!(slots(&tb).iter().any(|(_, ip)| *ip == a.ip.octets()));
    tb.gc(&[2]).unwrap();
    assert_eq!(slots(&tb).iter().map(|(_, ip)| *ip).collect::<Vec<_>>(), vec![c.ip.octets()], "GC left a slot");
    tb.del(0).unwrap();
    tb.del(2).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

/// The ifindex `pod` had (its veth is gone after DEL): read from the slots taken before.
fn ifindex_gone(held: &[(u64, [u8; 4])], pod: &Attached) -> u64 {
    held.iter().find(|(_, ip)| *ip == pod.ip.octets()).map(|(i, _)| *i).unwrap()
}
