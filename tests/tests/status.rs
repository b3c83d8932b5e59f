//! STATUS (spec 1.1): 0 when an ADD can succeed, code 50 with the reason when it cannot.
use ebpf_cni_tests::Testbed;
use serde_json::{Value, json};

fn status(tb: &Testbed, conf: &Value) -> (bool, Option<u64>, String) {
    let out = tb.cni_raw(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")], &conf.to_string()).unwrap();
    assert!(out.success || out.code().is_some(), "STATUS printed no error JSON: {:?}", out.stdout);
    (out.success, out.code(), out.json()["msg"].as_str().unwrap_or_default().to_string())
}

#[test]
fn status_reports_why_add_would_fail() {
    // A /30 has one address to give.
    let Some(mut tb) = Testbed::for_test("status_reports_why_add_would_fail", "status", "10.236.0.0/30") else {
        return;
    };
    let good = tb.conf("1.1.0");
    assert_eq!(status(&tb, &good), (true, None, String::new()));

    let mut no_bpffs = good.clone();
    no_bpffs["bpffsRoot"] = json!(tb.data_dir().join("not-bpffs/ebpf-cni"));
    let (_, code, msg) = status(&tb, &no_bpffs);
    assert_eq!(code, Some(50));
    assert!(msg.contains("bpffs"), "{msg}");

    std::fs::create_dir_all(tb.data_dir()).unwrap();
    let file = tb.data_dir().join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut unwritable = good.clone();
    unwritable["ipam"]["dataDir"] = json!(file);
    let (_, code, msg) = status(&tb, &unwritable);
    assert_eq!(code, Some(50));
    assert!(msg.contains("data dir"), "{msg}");

    let pod = tb.new_pod().unwrap();
    tb.add(pod).unwrap();
    let (_, code, msg) = status(&tb, &good);
    assert_eq!(code, Some(50), "{msg}");
    assert!(msg.contains("exhausted"), "{msg}");
    tb.del(pod).unwrap();
    assert!(status(&tb, &good).0, "the pool has an address again");

    // A delegated IPAM plugin answers for itself when it speaks 1.1.0; Debian's `static` stops
    // at 1.0.0, so it is not asked.
    let mut delegated = good.clone();
    delegated["ipam"] = json!({ "type": "static", "addresses": [{ "address": "10.236.1.5/24" }] });
    assert!(status(&tb, &delegated).0);

    let (_, code, _) = status(&tb, &tb.conf("1.0.0"));
    assert_eq!(code, Some(1), "STATUS does not exist before 1.1.0");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
