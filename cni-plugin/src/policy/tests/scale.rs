//! Compile time at the scale: 1,000 policies and 100 pods, all on this node (the worst
//! case: every pod a subject). Prints the figures (`--nocapture`); the bound is loose (debug
//! builds on a shared machine), the release figure goes in the report.
use std::time::{Duration, Instant};

use serde_json::json;

use super::{namespace, pod, policy};
use crate::policy::{Changes, Compiler, Input, Local};

pub fn scale_input(policies: usize, pods: usize) -> Input {
    let mut input = Input::default();
    for n in 0..10 {
        input.apply_namespace(&namespace(&format!("ns{n}"), json!({"team": format!("t{}", n % 3)})));
    }
    for i in 0..pods {
        let ip = format!("10.1.{}.{}", i / 250, i % 250 + 1);
        let labels = json!({"app": format!("app{}", i % 20), "tier": format!("t{}", i % 4)});
        input.apply_pod(&pod(&format!("ns{}", i % 10), &format!("p{i}"), labels, &[&ip]));
        input.locals.insert(ip.parse().unwrap(), Local { ifindex: 10 + i as u32, owner: i as u64 });
    }
    for k in 0..policies {
        let spec = json!({
            "podSelector": {"matchLabels": {"app": format!("app{}", k % 20)}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("app{}", (k + 1) % 20)}}},
                                  {"namespaceSelector": {"matchLabels": {"team": format!("t{}", k % 3)}},
                                   "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["t1", "t2"]}]}}],
                         "ports": [{"port": 8000 + (k % 50) as i32}, {"port": "serve-80-tcp"}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": format!("172.{}.0.0/16", 16 + k % 16), "except": [format!("172.{}.1.0/24", 16 + k % 16)]}}],
                        "ports": [{"port": 443, "endPort": 450}]}],
        });
        input.apply_policy(&policy(&format!("ns{}", k % 10), &format!("pol{k}"), spec));
    }
    input
}

#[test]
fn a_thousand_policies_on_a_hundred_pods() {
    let input = scale_input(1000, 100);
    let mut compiler = Compiler::default();
    let started = Instant::now();
    let first = compiler.compile(&input);
    let full = started.elapsed();
    // One pod's labels change: recompile and diff, as the agent does per event.
    let mut changed = input.clone();
    changed.apply_pod(&pod("ns3", "p3", json!({"app": "app7", "tier": "t1"}), &["10.1.0.4"]));
    let started = Instant::now();
    let second = compiler.compile(&changed);
    let changes = Changes::between(&first, &second);
    let again = started.elapsed();
    println!(
        "1000 policies x 100 pods: first compile {full:?}, recompile + diff {again:?}: {} rules, {} identities, {} changes",
        first.rules.len(),
        first.identities.len(),
        changes.len()
    );
    assert!(first.problems.is_empty(), "{:?}", first.problems);
    assert!(!changes.is_empty());
    assert!(again < Duration::from_secs(10), "{again:?}");
}
