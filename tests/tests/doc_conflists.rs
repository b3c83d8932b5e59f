//! The example conflists of docs/configuration.md are real: each one, as printed there, gives a pod its address
//! through the runtime driver (state redirected into the test's node), passes CHECK and is
//! deleted without a trace.
use ebpf_cni_tests::{
    Cluster,
    runtime::{Runtime, Sandbox},
};
use serde_json::{Value, json};

/// Every ```json block of docs/configuration.md that holds a conflist (`"plugins"`).
fn conflists() -> Vec<Value> {
    let doc = include_str!("../../docs/configuration.md");
    doc.split("```json\n")
        .skip(1)
        .filter_map(|block| block.split_once("\n```").map(|(json, _)| json))
        .filter(|json| json.contains("\"plugins\""))
        .map(|json| {
            serde_json::from_str(json).unwrap_or_else(|e| panic!("docs/configuration.md conflist: {e}\n{json}"))
        })
        .collect()
}

#[test]
fn documented_conflists_work() {
    let lists = conflists();
    let names: Vec<&str> = lists.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert!(lists.len() >= 3, "minimal, masquerade, chained with portmap: {names:?}");
    let Some(mut c) =
        Cluster::for_test("documented_conflists_work", "rdme", "10.244.0.0/16", ["10.244.1.0/24", "10.244.2.0/24"])
    else {
        return;
    };
    let node = &mut c.nodes[0];
    for mut list in lists {
        let ours = list["plugins"][0].as_object_mut().unwrap();
        assert_eq!(ours["type"], "ebpf-cni");
        ours.insert("bpffsRoot".into(), json!(node.bpffs_root()));
        ours.get_mut("ipam").unwrap()["dataDir"] = json!(node.data_dir());
        if ours.contains_key("logFile") {
            ours.insert("logFile".into(), json!(node.data_dir().with_file_name("plugin.log")));
        }
        let runtime = Runtime::for_testbed(node);
        let list = runtime.load(&list).unwrap();
        let pod = node.new_pod().unwrap();
        let sandbox: Sandbox = node.sandbox(pod);
        let result = runtime.add(&list, &sandbox).unwrap_or_else(|e| panic!("{}: {e}", list.name));
        assert!(result["ips"][0]["address"].as_str().unwrap().starts_with("10.244.1."), "{}: {result}", list.name);
        // Debian's portmap 1.1.1 fails CHECK of a pod without IPv6 (see docs/verbs.md).
        if !list.plugins.iter().any(|p| p["type"] == "portmap") {
            runtime.check(&list, &sandbox).unwrap_or_else(|e| panic!("CHECK {}: {e}", list.name));
        }
        runtime.del(&list, &sandbox).unwrap();
        assert!(node.leftovers().unwrap().is_empty(), "{}", list.name);
    }
}
