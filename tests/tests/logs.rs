//! The plugin's log: by default only errors, on stderr; with `logFile`, one line per verb
//! naming the container, the duration and the outcome. stdout carries the result alone.
use ebpf_cni_tests::Testbed;
use serde_json::{Value, json};

#[test]
fn quiet_by_default_and_errors_on_stderr() {
    let Some(mut node) = Testbed::for_test("quiet_by_default_and_errors_on_stderr", "logq", "10.250.1.0/24") else {
        return;
    };
    let pod = node.new_pod().unwrap();
    let out = node.cni("ADD", pod, &node.conf("1.1.0")).unwrap();
    assert!(out.success && out.stderr.is_empty(), "a successful ADD is silent: {:?}", out.stderr);
    let again = node.cni("ADD", pod, &node.conf("1.1.0")).unwrap();
    assert!(!again.success);
    let lines: Vec<&str> = again.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one error line: {:?}", again.stderr);
    assert!(lines[0].contains(" ERROR ") && lines[0].contains(&node.pods[pod].container_id), "{}", lines[0]);
    let error: Value = serde_json::from_str(&again.stdout).expect("stdout is the error JSON alone");
    assert_eq!(error["code"], 101, "{error}");
    node.del(pod).unwrap();
}

#[test]
fn log_file_has_one_line_per_verb() {
    let Some(mut node) = Testbed::for_test("log_file_has_one_line_per_verb", "logf", "10.250.2.0/24") else {
        return;
    };
    let log = node.data_dir().with_file_name("plugin.log");
    node.extra.insert("logFile".into(), json!(log));
    let pod = node.new_pod().unwrap();
    let add = node.cni("ADD", pod, &node.conf("1.1.0")).unwrap();
    assert!(add.success && add.stderr.is_empty(), "{}", add.stderr);
    let mut conf = node.conf("1.1.0");
    conf["prevResult"] = add.json();
    assert!(node.cni("CHECK", pod, &conf).unwrap().success);
    assert!(!node.cni("ADD", pod, &node.conf("1.1.0")).unwrap().success);
    assert!(node.cni("DEL", pod, &node.conf("1.1.0")).unwrap().success);

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let id = &node.pods[pod].container_id;
    let verbs = ["ADD", "CHECK", "ADD", "DEL"];
    assert_eq!(lines.len(), verbs.len(), "{text}");
    for (line, verb) in lines.iter().zip(verbs) {
        assert!(
            line.contains(&format!(" {verb} container=\"{id}\" ifname=\"eth0\" network=\"{}\"", node.network)),
            "{line}"
        );
        assert!(line.contains("ms "), "the duration: {line}");
    }
    assert!(lines[0].contains(" INFO ") && lines[0].ends_with(" ok"), "{}", lines[0]);
    assert!(lines[2].contains(" ERROR ") && lines[2].contains("failed:"), "{}", lines[2]);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o600, "only root reads it");
}
