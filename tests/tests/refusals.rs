//! Conditions an ADD cannot work under: a full `ENDPOINTS` map, pins of another layout
//! version, an interface name already taken in the pod. Each gets its own CNI code and a
//! message that says what to do, and the failed ADD leaves nothing of itself behind.
use aya::maps::{HashMap, Map, MapData};
use ebpf_cni_tests::{Testbed, run_in, runtime::Runtime};
use ebpf_common::{Endpoint, IpKey};

/// Fills the pinned ENDPOINTS map with entries of an owner no attachment has; returns how many.
fn fill_endpoints(tb: &Testbed) -> usize {
    let data = MapData::from_pin(tb.map_pin("ENDPOINTS")).unwrap();
    let mut map: HashMap<MapData, IpKey, Endpoint> = HashMap::try_from(Map::from_map_data(data).unwrap()).unwrap();
    let junk =
        Endpoint { host_ifindex: 999_999, flags: 0, owner: 0xdead, pod_mac: [0; 6], host_mac: [0; 6], stack_epoch: 0 };
    let mut added = 0;
    for n in 0u32.. {
        let [_, a, b, c] = n.to_be_bytes();
        if map.insert(IpKey::v4([100, a, b, c]), junk, 0).is_err() {
            break;
        }
        added += 1;
    }
    added
}

#[test]
fn a_full_endpoints_map_is_its_own_error() {
    let Some(mut tb) = Testbed::for_test("a_full_endpoints_map_is_its_own_error", "full", "10.225.0.0/24") else {
        return;
    };
    let rt = Runtime::for_testbed(&tb);
    let list = rt.load(&tb.conflist("1.1.0", vec![])).unwrap();
    let (a, b, c) = (tb.new_pod().unwrap(), tb.new_pod().unwrap(), tb.new_pod().unwrap());
    let ip_a = tb.add(a).unwrap();
    let filled = fill_endpoints(&tb);
    assert_eq!(filled + 1, ebpf_common::ENDPOINTS_MAX_ENTRIES as usize);
    let out = tb.cni("ADD", b, &tb.conf("1.1.0")).unwrap();
    assert_eq!(out.code(), Some(105), "{} {}", out.stdout, out.stderr);
    assert!(out.json()["msg"].as_str().unwrap().contains("ENDPOINTS is full"), "{}", out.stdout);
    assert_eq!(tb.host_veths().unwrap().len(), 1, "the failed ADD left its veth");
    assert_eq!(tb.ip_files().len(), 1, "the failed ADD left its address reserved");
    // GC with the one real pod removes entries nobody owns, and ADD works again.
    rt.gc(&list, &[&tb.sandbox(a)]).unwrap();
    assert_eq!(tb.map_len("ENDPOINTS").unwrap(), 1);
    let ip_c = tb.add(c).unwrap();
    assert!(tb.ping(&tb.pods[c].netns.name, &ip_a));
    assert!(tb.ping(&tb.pods[a].netns.name, &ip_c));
    tb.del(a).unwrap();
    tb.del(c).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn pins_of_another_layout_are_refused_and_kept() {
    let Some(mut tb) = Testbed::for_test("pins_of_another_layout_are_refused_and_kept", "layout", "10.224.0.0/24")
    else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    // What an older build left: its own version directory (bpffs holds directories and pins).
    let old = tb.pin_dir().join("v1");
    std::fs::create_dir_all(old.join("maps")).unwrap();
    let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
    assert_eq!(out.code(), Some(102), "{} {}", out.stdout, out.stderr);
    let msg = format!("{} {}", out.json()["msg"], out.json()["details"]);
    assert!(msg.contains("v1") && msg.contains("another ebpf-cni layout"), "{msg}");
    assert!(old.join("maps").exists(), "the failed ADD removed the other layout's pins");
    assert!(!tb.version_dir().exists(), "the failed ADD left pins of its own");
    assert!(tb.host_veths().unwrap().is_empty() && tb.ip_files().is_empty(), "the failed ADD left its pieces");
    std::fs::remove_dir_all(&old).unwrap();
    tb.add(pod).unwrap();
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}

#[test]
fn an_interface_name_taken_in_the_pod_is_refused() {
    let Some(mut tb) = Testbed::for_test("an_interface_name_taken_in_the_pod_is_refused", "taken", "10.223.0.0/24")
    else {
        return;
    };
    let pod = tb.new_pod().unwrap();
    let ns = tb.pods[pod].netns.name.clone();
    // The pod's own eth0 (this kernel has no dummy driver: a veth pair inside the pod).
    run_in(&ns, "ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "own0"]).unwrap();
    let out = tb.cni("ADD", pod, &tb.conf("1.1.0")).unwrap();
    assert_eq!(out.code(), Some(101), "{} {}", out.stdout, out.stderr);
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
    let links = run_in(&ns, "ip", &["-o", "link", "show", "eth0"]).unwrap();
    assert!(String::from_utf8_lossy(&links.stdout).contains("eth0@own0"), "the pod's own eth0 was touched");
}
