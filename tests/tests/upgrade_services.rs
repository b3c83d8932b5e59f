//! Issue 25: "An agent restart or an upgrade from the previous release keeps open connections
//! and Services working (maps pinned; no flap while the agent resyncs)". A LAN of two nodes runs
//! the previous release (`EBPF_CNI_PREVIOUS_RELEASE_BIN`, cbce232, this build's pin layout v4),
//! node 1 with `kubeProxyReplacement` (its socket LB in a cgroup of the test's own); that
//! release's `service-set` writes a ClusterIP (TCP and UDP) and a NodePort (TCP), all to pod a
//! on node 1. Open across the upgrade: a TCP connection and a connected UDP socket of a client
//! pod's process to the ClusterIP, and a TCP connection from the LAN's host to the NodePort.
//! Then every node runs this build's binary, which takes the old datapath as its own:
//! 1. the open connections go on, and no program was loaded or attached again;
//! 2. new connections to the ClusterIP and the NodePort work, and so does a pod this build ADDs;
//! 3. this build's `service-set` moves the frontends to pod b on node 2: the ClusterIP's TCP
//!    connection to a is ended at once, the connected UDP socket reaches b within 1 s, the
//!    NodePort connection's next segment meets a RST and a new one reaches b;
//! 4. after every DEL nothing is left.
use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use ebpf_cni_tests::{
    Plugin, Testbed,
    cgroup::TestCgroup,
    lan::{LAN_HOST, LAN_NODE_IPS, Lan, LanPod, PodNetwork, at},
    require_privileges, run, run_in,
    service_probe::{Client, TCP_PORT, Tagged, UDP_PORT, ask},
    traffic::in_netns,
    upgrade::release_plugin,
};
use serde_json::{Value, json};

const CLUSTER_CIDR: &str = "10.201.0.0/16";
const CLUSTER_IP: &str = "10.96.21.10";
const NODE_PORT: u16 = 30201;

/// A long-lived client of the ClusterIP in the cgroup and a pod's namespace: one socket,
/// connected once; each line on its stdin is a request (`x`: one message and its answer;
/// `hold`: wait for the connection to end), each answer a JSON line.
const CONVERSATION: &str = r#"
import json, socket, sys, time
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def out(**kw): print(json.dumps(kw), flush=True)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
try:
    s.settimeout(3); s.connect((host, port)); out(connected=True)
except OSError as e:
    out(error=e.errno); sys.exit()
for line in sys.stdin:
    t = time.monotonic()
    try:
        if line.strip() == "hold":
            s.settimeout(20); d = s.recv(64)
            out(ended="eof" if not d else "data", ms=(time.monotonic() - t) * 1000)
        else:
            s.settimeout(3 if kind == "tcp" else 0.3); s.send(b"q")
            out(peer="%s:%d" % s.getpeername(), reply=s.recv(64).decode())
    except socket.timeout: out(timeout=True)
    except OSError as e: out(ended=e.errno, ms=(time.monotonic() - t) * 1000)
"#;

struct Conversation {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
}

impl Conversation {
    /// `kind` (`tcp` or `udp`) to `CLUSTER_IP:port` from `pod`, its process in `cgroup`.
    fn open(cgroup: &TestCgroup, pod: &LanPod, kind: &str, port: u16) -> Self {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net=/run/netns/{}", pod.netns)).args(["python3", "-c", CONVERSATION]);
        command.args([kind, CLUSTER_IP, &port.to_string()]).stdin(Stdio::piped()).stdout(Stdio::piped());
        cgroup.confine(&mut command).unwrap();
        let mut child = command.spawn().unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::String(line)));
            }
        });
        let conversation = Self { child, stdin, lines };
        let opened = conversation.next(Duration::from_secs(5));
        assert_eq!(opened, json!({"connected": true}), "{kind} to the ClusterIP");
        conversation
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    fn next(&self, within: Duration) -> Value {
        self.lines.recv_timeout(within).unwrap_or_else(|_| panic!("no answer from the conversation within {within:?}"))
    }

    /// One message and its answer.
    fn exchange(&mut self) -> Value {
        self.say("x");
        self.next(Duration::from_secs(5))
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        // Our own child, by its PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Node 1's NodePort from the LAN's host.
fn node_port() -> SocketAddr {
    SocketAddr::new(LAN_NODE_IPS[0].parse().unwrap(), NODE_PORT)
}

fn connect_node_port(lan: &Lan) -> TcpStream {
    let host = lan.host.name.clone();
    let stream = in_netns(&host, || Ok(TcpStream::connect_timeout(&node_port(), Duration::from_secs(2))?))
        .unwrap_or_else(|e| panic!("connecting to the NodePort from the LAN: {e:#}"));
    stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    stream
}

/// Every program of `tb`'s datapath by where it is, with its id: the pinned ones, those on the
/// uplink's tc hooks, and (node 1) those attached to the socket LB's cgroup.
fn programs(tb: &Testbed, cgroup: Option<&TestCgroup>) -> BTreeMap<String, u64> {
    let mut ids = BTreeMap::new();
    for pin in std::fs::read_dir(tb.version_dir().join("progs")).unwrap().flatten() {
        let path = pin.path();
        let out = run("bpftool", &["-j", "prog", "show", "pinned", path.to_str().unwrap()]).unwrap();
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        ids.insert(format!("pinned {}", pin.file_name().to_string_lossy()), info["id"].as_u64().unwrap());
    }
    let out = run_in(&tb.node.name, "bpftool", &["-j", "net", "show"]).unwrap();
    let net: Value = serde_json::from_slice(&out.stdout).unwrap();
    for filter in net[0]["tc"].as_array().into_iter().flatten().filter(|f| f["devname"] == "eth0") {
        let place = format!("eth0 {} {}", filter["kind"].as_str().unwrap(), filter["name"].as_str().unwrap());
        ids.insert(place, filter["id"].as_u64().unwrap());
    }
    if let Some(cgroup) = cgroup {
        let out = run("bpftool", &["-j", "cgroup", "show", cgroup.path().to_str().unwrap()]).unwrap();
        let attached: Value = serde_json::from_slice(&out.stdout).unwrap();
        for prog in attached.as_array().into_iter().flatten() {
            let place = format!("cgroup {} {}", prog["attach_type"].as_str().unwrap(), prog["name"].as_str().unwrap());
            ids.insert(place, prog["id"].as_u64().unwrap());
        }
    }
    ids
}

#[test]
fn services_keep_working_across_an_upgrade_from_the_previous_release() {
    let test = "services_keep_working_across_an_upgrade_from_the_previous_release";
    if !require_privileges(test) {
        return;
    }
    let Some(old) = release_plugin("EBPF_CNI_PREVIOUS_RELEASE_BIN", test) else { return };
    let new = Plugin::from_env().unwrap();
    let started = Instant::now();
    let subnets = ["10.201.1.0/24", "10.201.2.0/24"];
    let mut lan = Lan::with_plugin("upgsvc", PodNetwork::EbpfCni, CLUSTER_CIDR, subnets, None, old.clone()).unwrap();
    let cgroup = TestCgroup::create(&format!("{}-socket-lb", lan.nodes[0].run_id)).unwrap();
    lan.use_kube_proxy_replacement(0, &cgroup, CLUSTER_CIDR, None);
    let (client, a) = (lan.add_pod(0).unwrap(), lan.add_pod(0).unwrap());
    let b = lan.add_pod(1).unwrap();
    let (_a, _b) = (Tagged::naming_peers(&a.netns, "A"), Tagged::naming_peers(&b.netns, "B"));
    let (cluster_tcp, cluster_udp) = (format!("{CLUSTER_IP}:80"), format!("{CLUSTER_IP}:53"));
    let node_port_frontend = format!("0.0.0.0:{NODE_PORT}");
    lan.service_set(0, &cluster_tcp, "tcp", &[at(a.ip, TCP_PORT)], &[]);
    lan.service_set(0, &cluster_udp, "udp", &[at(a.ip, UDP_PORT)], &[]);
    lan.service_set(0, &node_port_frontend, "tcp", &[at(a.ip, TCP_PORT)], &[]);
    let loaded = [programs(&lan.nodes[0], Some(&cgroup)), programs(&lan.nodes[1], None)];
    assert!(loaded[0].keys().any(|p| p.starts_with("cgroup ")), "no socket LB in the cgroup: {:?}", loaded[0]);
    assert!(loaded[0].keys().any(|p| p.starts_with("eth0 ")), "nothing on node 1's uplink: {:?}", loaded[0]);
    let setup = started.elapsed();

    // Open before the upgrade, each exchanging a message.
    let from_client = format!("A {}", client.ip);
    let (through_node, from_host) = (format!("B {}", LAN_NODE_IPS[0]), format!("A {LAN_HOST}"));
    let to_a = |port: u16| json!({"peer": format!("{CLUSTER_IP}:{port}"), "reply": from_client});
    let mut tcp = Conversation::open(&cgroup, &client, "tcp", 80);
    let mut udp = Conversation::open(&cgroup, &client, "udp", 53);
    assert_eq!(tcp.exchange(), to_a(80), "ClusterIP TCP before the upgrade");
    assert_eq!(udp.exchange(), to_a(53), "ClusterIP UDP before the upgrade");
    let mut lan_stream = connect_node_port(&lan);
    assert_eq!(ask(&mut lan_stream), Ok(from_host.clone()), "NodePort before the upgrade");

    // The upgrade: this build's binary on every node, for every verb and for service-set.
    let upgrading = Instant::now();
    lan.use_plugin(&new);
    let fresh = lan.add_pod(0).unwrap();
    let upgrade = upgrading.elapsed();

    // 1. The open connections go on; nothing was loaded or attached again.
    let checking = Instant::now();
    assert_eq!(tcp.exchange(), to_a(80), "the ClusterIP TCP connection after the upgrade");
    assert_eq!(udp.exchange(), to_a(53), "the connected UDP socket after the upgrade");
    assert_eq!(ask(&mut lan_stream), Ok(from_host.clone()), "the NodePort connection after the upgrade");
    let now = [programs(&lan.nodes[0], Some(&cgroup)), programs(&lan.nodes[1], None)];
    assert_eq!(now, loaded, "the new binary loaded or attached programs again");
    for (tb, loaded) in lan.nodes.iter().zip(&loaded) {
        let from_pod = loaded["pinned from_pod"];
        let filters = tb.from_pod_filter_programs().unwrap();
        assert!(filters.iter().all(|(_, id)| *id == from_pod), "a pod runs another from_pod: {filters:?}");
    }
    assert_eq!(lan.nodes[0].from_pod_filters().unwrap().len(), 3, "node 1: a from_pod filter per pod");

    // 2. New connections work, and so does the pod this build ADDed (its client in the cgroup).
    let once = |pod: &LanPod, args: &[&str]| Client::once(&cgroup, pod, args);
    assert_eq!(once(&client, &["tcp", CLUSTER_IP, "80"]), to_a(80), "a new ClusterIP TCP connection");
    assert_eq!(once(&client, &["udp", CLUSTER_IP, "53", "1", "0"]), to_a(53), "a new connected UDP socket");
    let mut again = connect_node_port(&lan);
    assert_eq!(ask(&mut again), Ok(from_host.clone()), "a new NodePort connection");
    drop(again);
    let from_fresh = json!({"peer": format!("{CLUSTER_IP}:80"), "reply": format!("A {}", fresh.ip)});
    assert_eq!(once(&fresh, &["tcp", CLUSTER_IP, "80"]), from_fresh, "the new pod to the ClusterIP");
    let checks = checking.elapsed();

    // 3. This build's service-set moves every frontend to b and settles what went to a.
    tcp.say("hold");
    let settled = lan.service_set(0, &cluster_tcp, "tcp", &[at(b.ip, TCP_PORT)], &[]);
    let moved = Instant::now();
    // The open connection; step 2's, closed, is left to its timers once no file holds it, but
    // its client process may still be exiting: then it is destroyed too.
    let destroyed = settled["destroyed"].as_u64().unwrap_or_default();
    assert!((1..=2).contains(&destroyed), "ClusterIP TCP: {settled}");
    let ended = tcp.next(Duration::from_secs(1));
    let tcp_ended = moved.elapsed();
    assert_eq!(ended["ended"], json!(libc::ECONNABORTED), "the ClusterIP TCP connection to a: {ended}");

    let settled = lan.service_set(0, &cluster_udp, "udp", &[at(b.ip, UDP_PORT)], &[]);
    let moved = Instant::now();
    assert_eq!(settled["reconnected"], json!(1), "ClusterIP UDP: {settled}");
    let to_b = json!({"peer": format!("{CLUSTER_IP}:53"), "reply": format!("B {}", client.ip)});
    loop {
        let line = udp.exchange();
        if line == to_b {
            break;
        }
        assert!(moved.elapsed() < Duration::from_secs(1), "the connected UDP socket still not on b: {line}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let udp_moved = moved.elapsed();
    assert!(udp_moved < Duration::from_secs(1), "the connected UDP socket reached b after {udp_moved:?}");

    let settled = lan.service_set(0, &node_port_frontend, "tcp", &[at(b.ip, TCP_PORT)], &[]);
    // The open connection and step 2's closed one, whose entries stay until they age.
    assert_eq!(settled["lan_flows"].as_u64().or(settled["lanFlows"].as_u64()), Some(2), "NodePort: {settled}");
    let (reset, lan_ended) = match ask(&mut lan_stream) {
        Err((errno, took)) => (errno, took),
        Ok(answer) => panic!("the NodePort connection to a still answers after the move: {answer}"),
    };
    assert!(reset == libc::ECONNRESET || reset == 0, "the NodePort connection to a ended with errno {reset}");
    assert!(lan_ended < Duration::from_secs(1), "the NodePort connection to a ended after {lan_ended:?}");
    let mut to_b_from_lan = connect_node_port(&lan);
    assert_eq!(ask(&mut to_b_from_lan), Ok(through_node), "a new NodePort connection after the move");
    assert_eq!(once(&fresh, &["tcp", CLUSTER_IP, "80"])["reply"], json!(format!("B {}", fresh.ip)));
    let now = [programs(&lan.nodes[0], Some(&cgroup)), programs(&lan.nodes[1], None)];
    assert_eq!(now, loaded, "service-set loaded or attached programs");

    // 4. Every pod goes; nothing is left, the cgroup holds no program.
    let deleting = Instant::now();
    drop((tcp, udp, lan_stream, to_b_from_lan));
    for pod in 0..3 {
        lan.del_pod(0, pod).unwrap();
    }
    lan.del_pod(1, 0).unwrap();
    let attached = run("bpftool", &["-j", "cgroup", "show", cgroup.path().to_str().unwrap()]).unwrap();
    let attached: Value = serde_json::from_slice(&attached.stdout).unwrap_or(json!([]));
    assert_eq!(attached.as_array().map_or(0, Vec::len), 0, "{attached}");
    for tb in &lan.nodes {
        assert_eq!(tb.leftovers().unwrap(), Vec::<String>::new(), "{}", tb.network);
    }
    let deleted = deleting.elapsed();
    let cgroup_path = cgroup.path().to_path_buf();
    drop(cgroup);
    assert!(!cgroup_path.exists(), "the test's cgroup is left");
    eprintln!(
        "upgrade with Services: setup {setup:.1?}; upgrade (binary swap + ADD) {upgrade:.1?}; open connections \
         and new ones checked in {checks:.1?}; after the move ClusterIP TCP ended in {tcp_ended:.1?} (errno {}), \
         connected UDP on b in {udp_moved:.1?}, NodePort connection ended in {lan_ended:.1?} (errno {reset}); \
         DEL of 4 pods {deleted:.1?}; {} programs kept their ids; settling destroyed {destroyed} TCP sockets",
        ended["ended"],
        loaded[0].len() + loaded[1].len(),
    );
}
