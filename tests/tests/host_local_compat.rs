//! The built-in IPAM shares its data dir with the reference host-local plugin: each sees and
//! keeps the other's reservations, and either can release what the other reserved.
use std::{
    io::Write,
    process::{Command, Stdio},
};

use ebpf_cni_tests::Testbed;
use serde_json::{Value, json};

/// Runs the reference host-local binary directly, as an IPAM plugin is run.
fn host_local(tb: &Testbed, command: &str, container_id: &str) -> Value {
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": tb.network,
        "ipam": { "type": "host-local", "subnet": tb.subnet, "dataDir": tb.data_dir() },
    });
    let mut child = Command::new("/usr/lib/cni/host-local")
        .envs([
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container_id),
            ("CNI_NETNS", "/dev/null"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "host-local {command}: {}", String::from_utf8_lossy(&out.stdout));
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[test]
fn reservations_are_shared_with_host_local() {
    let Some(mut tb) = Testbed::for_test("reservations_are_shared_with_host_local", "hlcompat", "10.241.0.0/24") else {
        return;
    };
    let theirs = host_local(&tb, "ADD", "reserved-by-host-local");
    assert_eq!(theirs["ips"][0]["address"], "10.241.0.2/24");
    let pod = tb.new_pod().unwrap();
    assert_eq!(tb.add(pod).unwrap(), "10.241.0.3", "ours must skip host-local's reservation");
    // host-local releases by container ID + ifname from the file we wrote.
    host_local(&tb, "DEL", &tb.pods[pod].container_id.clone());
    assert_eq!(tb.ip_files(), ["10.241.0.2"]);
    host_local(&tb, "DEL", "reserved-by-host-local");
    tb.del(pod).unwrap();
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
