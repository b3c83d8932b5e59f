//! `deploy/ebpf-cni.yaml` says what a node needs: checked field by field, and its installer
//! command run as written (its root moved to a throwaway directory).
use std::{path::PathBuf, process::Command};

use serde::Deserialize as _;
use serde_json::{Value, json};

fn documents() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/ebpf-cni.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text).map(|doc| Value::deserialize(doc).unwrap()).collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

#[test]
fn daemonset_runs_everywhere_with_what_it_needs() {
    let docs = documents();
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"], json!([{ "operator": "Exists" }]), "tolerates every taint");
    assert_eq!(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"]);

    let account = kind(&docs, "ServiceAccount");
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);
    let role = kind(&docs, "ClusterRole");
    let nodes = role["rules"].as_array().unwrap().iter().find(|r| strings(&r["resources"]).contains(&"nodes")).unwrap();
    for verb in ["get", "list"] {
        assert!(strings(&nodes["verbs"]).contains(&verb), "may {verb} nodes");
    }
    let binding = kind(&docs, "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], account["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["namespace"], account["metadata"]["namespace"]);

    let node_name = json!([{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } }]);
    let install = &pod["initContainers"][0];
    assert_eq!(strings(&install["command"])[..4], ["/ebpf-cni", "install", "--root", "/host"]);
    assert_eq!(install["env"], node_name);
    let agent = &pod["containers"][0];
    assert_eq!(strings(&agent["command"])[..2], ["/ebpf-cni", "agent"]);
    assert_eq!(agent["env"][0], node_name[0]);
    assert_eq!(agent["securityContext"]["privileged"], true);
    // The agent's bpffs mount (on a node that had none) must become the host's.
    let bpffs = agent["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "bpffs").unwrap();
    assert_eq!(
        (bpffs["mountPath"].as_str(), bpffs["mountPropagation"].as_str()),
        (Some("/sys/fs/bpf"), Some("Bidirectional"))
    );

    // The agent reads the node file the installer wrote, to load the datapath ahead.
    let node_conf = agent["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "node-conf").unwrap();
    assert_eq!((node_conf["mountPath"].as_str(), node_conf["readOnly"].as_bool()), (Some("/etc/ebpf-cni"), Some(true)));

    // The installer's mounts put the host's CNI directories where `--root /host` writes.
    let host_path = |volume: &str| {
        let v = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == volume).unwrap();
        v["hostPath"]["path"].as_str().unwrap().to_string()
    };
    let mounts: Vec<(String, String)> = install["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["mountPath"].as_str().unwrap().to_string(), host_path(m["name"].as_str().unwrap())))
        .collect();
    for dir in ["/opt/cni/bin", "/etc/cni/net.d", "/etc/ebpf-cni"] {
        assert!(mounts.contains(&(format!("/host{dir}"), dir.to_string())), "{dir} mounted at /host{dir}: {mounts:?}");
    }
}

/// The agent serves metrics where the scrape annotations say: the node's address (the pod's,
/// with hostNetwork), the annotated port, /metrics.
#[test]
fn metrics_are_served_where_the_annotations_point() {
    let docs = documents();
    let template = &kind(&docs, "DaemonSet")["spec"]["template"];
    let annotations = &template["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true", "a string: annotations are strings");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let port = annotations["prometheus.io/port"].as_str().unwrap();
    let agent = &template["spec"]["containers"][0];
    let command = strings(&agent["command"]);
    let at = command.iter().position(|a| *a == "--metrics-addr").expect("the agent serves metrics");
    let addr = command[at + 1];
    assert_eq!(addr, format!("$(HOST_IP):{port}"));
    let host_ip = json!({ "name": "HOST_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } } });
    assert!(agent["env"].as_array().unwrap().contains(&host_ip), "{}", agent["env"]);
    // As the kubelet expands it on a node, the agent's flag parses it.
    let expanded = addr.replace("$(HOST_IP)", "192.0.2.7");
    assert!(expanded.parse::<std::net::SocketAddr>().is_ok(), "{expanded}");
    let declared = &agent["ports"][0];
    assert_eq!((declared["name"].as_str(), declared["containerPort"].to_string()), (Some("metrics"), port.to_string()));
}

#[test]
fn the_installer_command_works_as_written() {
    let Ok(binary) = ebpf_cni_tests::Plugin::from_env() else {
        assert!(std::env::var("CI").is_err(), "CI must have the plugin built");
        return;
    };
    let docs = documents();
    let install = &kind(&docs, "DaemonSet")["spec"]["template"]["spec"]["initContainers"][0];
    let dir = std::env::temp_dir().join(format!("ecni-manifest-{}", std::process::id()));
    let nodes = dir.join("nodes.json");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &nodes,
        json!({"items": [{"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.244.3.0/24"}}]}).to_string(),
    )
    .unwrap();
    let root = dir.join("host");
    let args: Vec<String> = strings(&install["command"])[2..]
        .iter()
        .map(|a| if *a == "/host" { root.to_str().unwrap().to_string() } else { a.to_string() })
        .collect();
    let out = Command::new(&binary.binary)
        .arg("install")
        .args(&args)
        .args(["--nodes-file", nodes.to_str().unwrap()])
        .env("NODE_NAME", "n1")
        .output()
        .unwrap();
    let conflist = std::fs::read_to_string(root.join("etc/cni/net.d/10-ebpf-cni.conflist"));
    let node_file = std::fs::read_to_string(root.join("etc/ebpf-cni/node.json"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let conflist: Value = serde_json::from_str(&conflist.unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.244.3.0/24");
    assert_eq!(conflist["plugins"][0]["ipMasq"], true);
    // The masquerading network is the node file's primary one, or every ADD would be refused.
    let node_file: Value = serde_json::from_str(&node_file.unwrap()).unwrap();
    assert_eq!(node_file["primaryNetwork"], conflist["name"]);
}
