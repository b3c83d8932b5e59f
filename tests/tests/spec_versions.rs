//! Every verb in every spec version, as the reference plugins test it: which verbs a version
//! allows (CHECK from 0.4.0, GC and STATUS from 1.1.0), answers in the asked version, and the
//! whole lifecycle leaving nothing behind. Prints the verb × version table it saw.
use ebpf_cni_tests::{CniOutput, Testbed, runtime::Runtime};
use serde_json::{Value, json};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// "ok", or the error code.
fn outcome(out: &CniOutput) -> String {
    if out.success { "ok".into() } else { format!("code {}", out.code().map_or("?".into(), |c| c.to_string())) }
}

#[test]
fn every_verb_in_every_version() {
    let Some(mut tb) = Testbed::for_test("every_verb_in_every_version", "verbs", "10.243.0.0/24") else { return };
    let rt = Runtime::for_testbed(&tb);
    let mut table = vec!["| version | VERSION | ADD | CHECK | STATUS | GC | DEL | DEL again |".to_string()];
    for version in VERSIONS {
        let list = rt.load(&tb.conflist(version, vec![])).unwrap();
        let plugin = list.plugins[0].clone();
        let pod = tb.new_pod().unwrap();
        let sb = tb.sandbox(pod);
        let allowed =
            |since: &str| VERSIONS.iter().position(|v| *v == version) >= VERSIONS.iter().position(|v| *v == since);
        let expect = |out: &CniOutput, ok: bool, verb: &str| {
            if ok {
                assert!(out.success, "{version} {verb}: {} {}", out.stdout, out.stderr);
            } else {
                assert_eq!(out.code(), Some(1), "{version} {verb} must be refused as incompatible: {}", out.stdout);
                assert_eq!(out.json()["cniVersion"], version, "{version} {verb}: error in another version");
            }
        };

        let ver = tb.cni_raw(&[("CNI_COMMAND", "VERSION")], &json!({ "cniVersion": version }).to_string()).unwrap();
        assert_eq!(ver.json()["cniVersion"], version);

        let add = rt.invoke(&list, &plugin, "ADD", Some(&sb), &[]).unwrap();
        expect(&add, true, "ADD");
        let result: Value = serde_json::from_str(&add.stdout).expect("ADD prints one JSON document");
        assert_eq!(result["cniVersion"], version);
        assert_eq!(result["ips"][0].get("version").is_some(), version.starts_with("0."), "{version}: ips[].version");

        let check = rt.invoke(&list, &plugin, "CHECK", Some(&sb), &[("prevResult", result.clone())]).unwrap();
        expect(&check, allowed("0.4.0"), "CHECK");
        let status = rt.invoke(&list, &plugin, "STATUS", None, &[]).unwrap();
        expect(&status, allowed("1.1.0"), "STATUS");
        let valid = json!([{ "containerID": sb.container_id, "ifname": "eth0" }]);
        let gc = rt.invoke(&list, &plugin, "GC", None, &[("cni.dev/valid-attachments", valid)]).unwrap();
        expect(&gc, allowed("1.1.0"), "GC");
        assert_eq!(tb.host_veths().unwrap().len(), 1, "{version}: GC removed a valid attachment");
        assert!(tb.ping(&tb.node.name, result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap()));

        let del = rt.invoke(&list, &plugin, "DEL", Some(&sb), &[("prevResult", result)]).unwrap();
        expect(&del, true, "DEL");
        let again = rt.invoke(&list, &plugin, "DEL", Some(&sb), &[]).unwrap();
        expect(&again, true, "DEL again");
        assert!(del.stdout.trim().is_empty() && again.stdout.trim().is_empty(), "DEL printed a result");
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{version}");
        table.push(format!(
            "| {version} | ok | {} | {} | {} | {} | {} | {} |",
            outcome(&add),
            outcome(&check),
            outcome(&status),
            outcome(&gc),
            outcome(&del),
            outcome(&again)
        ));
    }
    eprintln!("{}", table.join("\n"));
}

#[test]
fn cni_versions_list_is_negotiated() {
    let Some(mut tb) = Testbed::for_test("cni_versions_list_is_negotiated", "nego", "10.242.0.0/24") else { return };
    let pod = tb.new_pod().unwrap();
    // A configuration with only `cniVersions`: the newest we speak wins, and the result says so.
    let mut conf = tb.conf("1.0.0");
    conf.as_object_mut().unwrap().remove("cniVersion");
    conf["cniVersions"] = json!(["0.4.0", "1.0.0", "1.1.0", "9.0.0"]);
    let add = tb.cni("ADD", pod, &conf).unwrap();
    assert!(add.success, "{}", add.stdout);
    assert_eq!(add.json()["cniVersion"], "1.1.0");
    tb.del(pod).unwrap();
    // A chain with Debian's reference plugins (they stop at 1.0.0) settles on 1.0.0.
    let rt = Runtime::for_testbed(&tb);
    let mut conflist = tb.conflist("1.1.0", vec![json!({ "type": "tuning" })]);
    conflist["cniVersions"] = json!(["0.4.0", "1.0.0", "1.1.0"]);
    assert_eq!(rt.load(&conflist).unwrap().cni_version, "1.0.0");
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
