//! NetworkPolicy across an upgrade from the previous release (`EBPF_CNI_PREVIOUS_RELEASE_BIN`,
//! cbce232, with NetworkPolicy; this build's pin layout v4). That release loads the
//! datapath and its `policy-set` isolates pod b: only pod a may reach b's port 8080. A TCP
//! connection a → b:8080 is open across the binary swap. This build then writes the same input
//! plus a new pod d of a's labels into the old release's maps (the programs stay the old ones):
//! the open connection keeps exchanging, what was denied stays denied, the new pod gets what its
//! labels allow, and when this build removes the policy b is open again. Then every pod goes and
//! nothing is left.
use std::{
    io::{Read, Write},
    net::{SocketAddr, SocketAddrV4, TcpListener},
    thread::JoinHandle,
    time::Duration,
};

use ebpf_cni_tests::{
    Testbed,
    policy_maps::{pod_object, policy_set},
    probe::{self, Servers},
    require_privileges, traffic,
    upgrade::release_plugin,
};
use serde_json::{Value, json};

fn input(pods: Vec<Value>, policies: Value) -> Value {
    json!({"namespaces": [{"metadata": {"name": "x"}}], "pods": pods, "networkPolicies": policies})
}

/// Echoes every read on the first connection `listener` accepts, until it ends; returns the
/// bytes it echoed.
fn echo_one(listener: TcpListener) -> JoinHandle<std::io::Result<usize>> {
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let (mut buf, mut echoed) = ([0u8; 256], 0);
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(echoed);
            }
            stream.write_all(&buf[..n])?;
            echoed += n;
        }
    })
}

/// Writes `line` on the open connection and reads it back.
fn exchange(stream: &mut std::net::TcpStream, line: &[u8]) -> bool {
    let mut buf = vec![0u8; line.len()];
    stream.write_all(line).is_ok() && stream.read_exact(&mut buf).is_ok() && buf == line
}

fn reaches(netns: &str, at: SocketAddrV4) -> bool {
    probe::ask_tcp(netns, SocketAddr::from(at)).is_ok()
}

#[test]
fn policies_of_the_previous_release_hold_across_an_upgrade() {
    let test = "policies_of_the_previous_release_hold_across_an_upgrade";
    if !require_privileges(test) {
        return;
    }
    let Some(old) = release_plugin("EBPF_CNI_PREVIOUS_RELEASE_BIN", test) else { return };
    let new = ebpf_cni_tests::Plugin::from_env().unwrap();
    let mut tb = Testbed::with_plugin("upgpol", "10.218.0.0/24", old).unwrap();
    let pods = tb.add_attachments(3).unwrap();
    let (a, b, c) = (pods[0].ip, pods[1].ip, pods[2].ip);
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    let (web, long) = (SocketAddrV4::new(b, 8080), SocketAddrV4::new(b, 8081));
    let mut servers = Servers::default();
    for at in [web, SocketAddrV4::new(b, 9090)] {
        servers.tcp(&ns[1], at).unwrap();
    }
    let echo = echo_one(traffic::tcp_listener(&ns[1], long).unwrap());
    let client = json!({"app": "client"});
    let mut objects =
        vec![pod_object("a", client.clone(), a.into()), pod_object("b", json!({"app": "server"}), b.into())];
    objects.push(pod_object("c", json!({"app": "other"}), c.into()));
    let allow_client = json!([{
        "metadata": {"namespace": "x", "name": "web-from-client"},
        "spec": {"podSelector": {"matchLabels": {"app": "server"}},
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                              "ports": [{"port": 8080}, {"port": 8081}]}]},
    }]);
    let wrote = policy_set(&tb, &input(objects.clone(), allow_client.clone()));
    assert_eq!(wrote["policies"], json!(1), "the previous release's policy-set: {wrote}");
    assert!(reaches(&ns[0], web), "a → b:8080 under the old release's policy");
    let mut open = traffic::tcp_connect(&ns[0], 0, long).unwrap();
    open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(exchange(&mut open, b"before\n"), "a → b:8081, the connection kept open");
    assert!(!reaches(&ns[2], web), "c → b:8080 under the old release's policy");

    // The upgrade: this build's binary for every verb and for the policy.
    let loaded = tb.program_id().expect("the previous release loaded no v4 datapath");
    tb.plugin = new;
    let d = tb.add_attachments(1).unwrap()[0].ip;
    assert_eq!(tb.program_id().unwrap(), loaded, "the new binary loaded the datapath again");
    let ns: Vec<String> = tb.pods.iter().map(|p| p.netns.name.clone()).collect();
    objects.push(pod_object("d", client, d.into()));
    let wrote = policy_set(&tb, &input(objects.clone(), allow_client));
    assert_eq!(wrote["failed"], json!(0), "this build's policy-set on the old maps: {wrote}");
    assert!(exchange(&mut open, b"after\n"), "the connection open across the upgrade");
    assert!(!reaches(&ns[2], web), "c → b:8080 after the upgrade");
    assert!(!reaches(&ns[0], SocketAddrV4::new(b, 9090)), "a → b:9090 after the upgrade: no rule");
    assert!(reaches(&ns[3], web), "the new pod d (a client) → b:8080");

    // This build removes the policy: b is open to everyone again.
    let gone = policy_set(&tb, &input(objects, json!([])));
    assert_eq!(gone["rules"], json!(0), "{gone}");
    assert!(reaches(&ns[2], web), "c → b:8080 once no policy selects b");
    assert!(exchange(&mut open, b"open again\n"), "the connection open across the upgrade, policy gone");
    drop(open);
    assert_eq!(echo.join().unwrap().unwrap(), "before\nafter\nopen again\n".len());
    drop(servers);
    for pod in (0..tb.pods.len()).rev() {
        tb.del(pod).unwrap();
    }
    assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new());
}
