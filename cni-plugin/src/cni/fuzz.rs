//! Property tests over everything a runtime (or an attacker who can write a conflist) hands us:
//! stdin bytes, network configurations, `CNI_*` variables, and results read back from a
//! delegate. CI runs `EBPF_CNI_FUZZ_CASES` (default 2,000) cases per property; by hand:
//! `EBPF_CNI_FUZZ_CASES=200000 cargo test -p cni-plugin --bins fuzz -- --nocapture`.
use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;
use proptest::{prelude::*, test_runner::TestRunner};
use serde_json::{Value, json};

use super::{
    ErrorCode,
    config::NetConf,
    env::{CniEnv, MAX_ID_LEN},
    result::{AddResult, Interface, IpConfig, Route},
    version,
};

fn cases() -> u32 {
    std::env::var("EBPF_CNI_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

/// Runs `test` over `strategy` for the configured number of cases and reports how many ran.
fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let started = std::time::Instant::now();
    let mut runner =
        TestRunner::new(ProptestConfig { cases: cases(), failure_persistence: None, ..Default::default() });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name}: {e}");
    }
    eprintln!("fuzz {name}: {} cases in {:?}, no failure", cases(), started.elapsed());
}

/// Strings that probe the validators: traversal, separators, overlong, control characters.
fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_.-]{0,20}",
        Just("..".to_string()),
        Just("../../etc/passwd".to_string()),
        "[./a-z]{1,12}",
        "\\PC{0,40}",
        "[a-f0-9]{250,300}",
        "[a-z]{14,17}",
        Just("eth0\0x".to_string()),
        Just(" eth0".to_string()),
    ]
}

/// JSON values of every kind, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        hostile_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(hostile_text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A configuration built from the fields we read, each either plausible or anything at all.
fn config_like() -> impl Strategy<Value = Value> {
    let field = |plausible: BoxedStrategy<Value>| prop_oneof![3 => plausible, 1 => any_json()];
    let version =
        prop_oneof![prop::sample::select(version::SUPPORTED.to_vec()).prop_map(|v| json!(v)), Just(json!("9.9.9")),]
            .boxed();
    let cidr = "(10|192)\\.[0-9]{1,3}\\.0\\.0/[0-9]{1,2}".prop_map(|s| json!(s)).boxed();
    let ports = "[0-9]{1,5}-[0-9]{1,5}".prop_map(|s| json!(s)).boxed();
    (
        field(version),
        field(hostile_text().prop_map(Value::String).boxed()),
        field(cidr.clone()),
        field(cidr.prop_map(|c| json!({ "type": "host-local", "subnet": c })).boxed()),
        field((0u32..70_000).prop_map(|m| json!(m)).boxed()),
        field(ports),
        field(hostile_text().prop_map(Value::String).boxed()),
    )
        .prop_map(|(cni_version, name, cluster, ipam, mtu, ports, uplink)| {
            json!({
                "cniVersion": cni_version, "name": name, "type": "ebpf-cni", "ipam": ipam, "mtu": mtu,
                "clusterCIDR": cluster, "masqPortRange": ports, "uplink": uplink, "ipMasq": true,
            })
        })
}

/// What a configuration error may be: never a crash, never a code meant for something else.
fn config_code_ok(code: ErrorCode) -> bool {
    [ErrorCode::INCOMPATIBLE_VERSION, ErrorCode::DECODE, ErrorCode::INVALID_CONFIG].contains(&code)
}

#[test]
fn stdin_bytes_never_panic() {
    run("stdin bytes", prop::collection::vec(any::<u8>(), 0..256), |bytes| {
        let _ = version::asked(&bytes);
        if let Err(e) = NetConf::parse(&bytes) {
            prop_assert!(config_code_ok(e.code), "code {:?} for {bytes:?}", e.code);
        }
        Ok(())
    });
}

#[test]
fn configurations_parse_or_fail_with_a_config_code() {
    run("configurations", config_like(), |conf| {
        let raw = serde_json::to_vec(&conf).expect("serializable");
        match NetConf::parse(&raw) {
            Ok(parsed) => {
                // Whatever passed can safely become a directory name and an interface name.
                prop_assert!(!parsed.name.contains('/') && !parsed.name.starts_with('.'));
                prop_assert!(parsed.name.len() <= MAX_ID_LEN);
                prop_assert!(parsed.uplink.as_deref().is_none_or(|u| u.len() <= 15 && !u.contains('/')));
            }
            Err(e) => prop_assert!(config_code_ok(e.code), "code {:?} for {conf}", e.code),
        }
        Ok(())
    });
}

#[test]
fn environments_are_validated_before_use() {
    let keys = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS"];
    let command = prop::sample::select(vec!["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "add", ""]);
    let values = prop::collection::vec(prop::option::of(hostile_text()), keys.len());
    run("environments", (command, values), |(command, values)| {
        let mut map: BTreeMap<&str, String> = keys.iter().zip(values).filter_map(|(k, v)| v.map(|v| (*k, v))).collect();
        map.insert("CNI_COMMAND", command.to_string());
        match CniEnv::from_lookup(|k| map.get(k).cloned()) {
            Ok(env) => {
                let id = &env.container_id;
                prop_assert!(id.len() <= MAX_ID_LEN && !id.contains('/') && !id.starts_with('.'));
                let ifname = &env.ifname;
                prop_assert!(ifname.len() <= 15 && !ifname.contains('/') && ifname != "." && ifname != "..");
            }
            Err(e) => prop_assert_eq!(e.code, ErrorCode::INVALID_ENV),
        }
        Ok(())
    });
}

fn address() -> impl Strategy<Value = IpNetwork> {
    prop_oneof![
        (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, p)| IpNetwork::new(IpAddr::from(a), p).expect("valid prefix")),
        (any::<[u8; 16]>(), 0u8..=128).prop_map(|(a, p)| IpNetwork::new(IpAddr::from(a), p).expect("valid prefix")),
    ]
}

fn add_result() -> impl Strategy<Value = AddResult> {
    let interface = ("[a-z0-9]{1,15}", "([0-9a-f]{2}:){5}[0-9a-f]{2}", prop::option::of("/run/netns/[a-z0-9-]{1,20}"))
        .prop_map(|(name, mac, sandbox)| Interface { name, mac, sandbox });
    let ip = (address(), prop::option::of(any::<[u8; 4]>()), prop::option::of(0usize..4))
        .prop_map(|(address, gw, interface)| IpConfig { address, gateway: gw.map(IpAddr::from), interface });
    let route =
        (address(), prop::option::of(any::<[u8; 4]>())).prop_map(|(dst, gw)| Route { dst, gw: gw.map(IpAddr::from) });
    (prop::collection::vec(interface, 0..3), prop::collection::vec(ip, 0..3), prop::collection::vec(route, 0..3))
        .prop_map(|(interfaces, ips, routes)| AddResult { interfaces, ips, routes, dns: json!({}) })
}

#[test]
fn results_round_trip_through_every_version() {
    run("results", add_result(), |result| {
        for v in version::SUPPORTED {
            let written = result.to_json(v);
            prop_assert_eq!(&written["cniVersion"], v);
            let has_version = written["ips"].as_array().expect("list").iter().all(|ip| ip.get("version").is_some());
            prop_assert!(result.ips.is_empty() || has_version == version::result_has_ip_version(v));
            let read = AddResult::from_json(&written).map_err(|e| TestCaseError::fail(e.msg))?;
            prop_assert_eq!(&read, &result);
        }
        Ok(())
    });
}

#[test]
fn results_of_any_shape_never_panic() {
    run("result shapes", any_json(), |value| {
        if let Err(e) = AddResult::from_json(&value) {
            prop_assert_eq!(e.code, ErrorCode::DECODE);
        }
        Ok(())
    });
}
