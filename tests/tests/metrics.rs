//! `ebpf-cni metrics` and the agent's `/metrics` on live nodes, read with the reference
//! Prometheus parser (`prometheus_client`): every family has HELP and TYPE, and the figures are
//! the traffic the test made: spoofed packets counted exactly, endpoints, a masqueraded flow's
//! two NAT entries, the agent's syncs. Errors are one line on stderr, a closed pipe is quiet.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    os::unix::process::ExitStatusExt as _,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ebpf_cni_tests::{
    Attached, Cluster, EXT_SERVER, Testbed, UNDERLAY_IPS,
    agent::RunningAgent,
    frames,
    prometheus::{self, http_get},
    run, run_in,
    traffic::{self, PacketSocket},
};
use ebpf_common::{DropReason, ENDPOINTS_MAX_ENTRIES, ForwardPath, NAT_MAX_ENTRIES, PIN_LAYOUT_VERSION};
use serde_json::json;

const SUBNETS: [&str; 2] = ["10.218.1.0/24", "10.218.2.0/24"];

/// Every datapath family of a readable network (a counter's family name has no `_total`).
const DATAPATH_FAMILIES: [(&str, &str); 13] = [
    ("ebpf_cni_up", "gauge"),
    ("ebpf_cni_drops", "counter"),
    ("ebpf_cni_dropped_bytes", "counter"),
    ("ebpf_cni_forwarded_packets", "counter"),
    ("ebpf_cni_forwarded_bytes", "counter"),
    ("ebpf_cni_nat_port_claim_failures", "counter"),
    ("ebpf_cni_endpoints", "gauge"),
    ("ebpf_cni_endpoints_capacity_entries", "gauge"),
    ("ebpf_cni_nat_entries", "gauge"),
    ("ebpf_cni_nat_capacity_entries", "gauge"),
    ("ebpf_cni_datapath_layout_version", "gauge"),
    ("ebpf_cni_datapath_loaded_timestamp_seconds", "gauge"),
    ("ebpf_cni_map_memory_bytes", "gauge"),
];

const AGENT_FAMILIES: [(&str, &str); 4] = [
    ("ebpf_cni_agent_routes", "gauge"),
    ("ebpf_cni_agent_syncs", "counter"),
    ("ebpf_cni_agent_sync_errors", "counter"),
    ("ebpf_cni_agent_last_sync_timestamp_seconds", "gauge"),
];

fn metrics_command(node: &Testbed, args: &[&str]) -> Command {
    let mut command = Command::new(&node.plugin.binary);
    command.arg("metrics").args(["--bpffs-root", node.bpffs_root().to_str().unwrap()]).args(args);
    command
}

/// `ebpf-cni metrics <args…>` for `node`: (success, stdout, stderr).
fn metrics(node: &Testbed, args: &[&str]) -> (bool, String, String) {
    let out = metrics_command(node, args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Parses a page, checking that the parser found every family declared (HELP and TYPE, no
/// `unknown` family made of stray samples) and that each declared family is in the text once.
fn parse(text: &str) -> Vec<prometheus::Family> {
    let families = prometheus::parse(text).unwrap();
    for family in &families {
        assert!(["counter", "gauge"].contains(&family.kind.as_str()), "{family:?} has no TYPE:\n{text}");
        assert!(!family.help.is_empty(), "{family:?} has no HELP:\n{text}");
        assert!(!family.samples.is_empty(), "{family:?}");
        let declared = family.samples[0].name.as_str();
        assert_eq!(text.matches(&format!("# HELP {declared} ")).count(), 1, "{declared}:\n{text}");
        assert_eq!(text.matches(&format!("# TYPE {declared} ")).count(), 1, "{declared}:\n{text}");
        if family.kind == "counter" {
            assert!(family.samples.iter().all(|s| s.name == format!("{}_total", family.name)), "{family:?}");
        }
    }
    families
}

fn kinds(families: &[prometheus::Family]) -> Vec<(String, String)> {
    let mut kinds: Vec<(String, String)> = families.iter().map(|f| (f.name.clone(), f.kind.clone())).collect();
    kinds.sort();
    kinds
}

fn expected(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut kinds: Vec<(String, String)> = list.iter().map(|(n, k)| (n.to_string(), k.to_string())).collect();
    kinds.sort();
    kinds
}

/// The one-shot page of `node`'s network, parsed.
fn scrape_once(node: &Testbed) -> Vec<prometheus::Family> {
    let (ok, stdout, stderr) = metrics(node, &[]);
    assert!(ok && stderr.is_empty(), "{stderr}");
    parse(&stdout)
}

fn now_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// An IPv4/UDP frame from pod `a` through its gateway with another source address: the
/// datapath drops it as spoofed-source. 58 bytes on the wire.
fn spoofed_frame(a: &Attached, src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    [frames::ethernet(a.host_mac, a.pod_mac, 0x0800), frames::ipv4_udp(src, dst, b"ebpf-cni-metrics")].concat()
}

#[test]
fn the_page_shows_what_the_datapath_did() {
    let Some(mut c) = Cluster::for_test("the_page_shows_what_the_datapath_did", "metr", "10.218.0.0/16", SUBNETS)
    else {
        return;
    };
    let started = now_seconds();
    let node = &mut c.nodes[0];
    let pods = node.add_attachments(2).unwrap();
    let network = node.network.clone();
    let net = [("network", network.as_str())];

    let before = scrape_once(node);
    assert_eq!(kinds(&before), expected(&DATAPATH_FAMILIES));
    let value = |families: &[prometheus::Family], name: &str, labels: &[(&str, &str)]| {
        prometheus::value(families, name, labels).unwrap_or_else(|| panic!("no single {name} {labels:?}"))
    };
    assert_eq!(value(&before, "ebpf_cni_up", &net), 1.0);
    assert_eq!(value(&before, "ebpf_cni_endpoints", &net), 2.0, "the pods added");
    assert_eq!(value(&before, "ebpf_cni_endpoints_capacity_entries", &net), f64::from(ENDPOINTS_MAX_ENTRIES));
    assert_eq!(value(&before, "ebpf_cni_nat_entries", &net), 0.0);
    assert_eq!(value(&before, "ebpf_cni_nat_capacity_entries", &net), f64::from(NAT_MAX_ENTRIES));
    assert_eq!(value(&before, "ebpf_cni_nat_port_claim_failures_total", &net), 0.0);
    assert_eq!(value(&before, "ebpf_cni_datapath_layout_version", &net), f64::from(PIN_LAYOUT_VERSION));
    // The load time: the first ADD's, as bpftool reads it from the same program.
    let loaded = value(&before, "ebpf_cni_datapath_loaded_timestamp_seconds", &net);
    let pin = node.version_dir().join("progs/from_pod");
    let info: serde_json::Value = serde_json::from_slice(
        &run("bpftool", &["-j", "prog", "show", "pinned", pin.to_str().unwrap()]).unwrap().stdout,
    )
    .unwrap();
    let bpftool_loaded = info["loaded_at"].as_f64().unwrap();
    assert!((loaded - bpftool_loaded).abs() <= 1.0, "loaded at {loaded}, bpftool says {bpftool_loaded}");
    assert!((started - 2.0..=now_seconds() + 2.0).contains(&loaded), "loaded at {loaded}, test started {started}");
    for name in ["ebpf_cni_drops_total", "ebpf_cni_dropped_bytes_total"] {
        let mut reasons: Vec<&str> = before
            .iter()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == name)
            .map(|s| s.labels["reason"].as_str())
            .collect();
        reasons.sort();
        let mut all: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
        all.sort();
        assert_eq!(reasons, all, "{name}: every reason, zeros included");
    }

    // Exactly N packets from a source address that is not the pod's own.
    const N: u64 = 5;
    let socket = PacketSocket::open(&node.pods[0].netns.name, "eth0").unwrap();
    let frame = spoofed_frame(&pods[0], "10.218.1.200".parse().unwrap(), pods[1].ip);
    for _ in 0..N {
        socket.send(&frame).unwrap();
    }
    // A masqueraded flow, answered so that it is surely through: egress and reply entries.
    let server = SocketAddrV4::new(EXT_SERVER.parse().unwrap(), 5300);
    let listener = traffic::udp_socket(&c.ext.name, server).unwrap();
    let node = &c.nodes[0];
    let client = traffic::udp_socket(&node.pods[0].netns.name, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 4242)).unwrap();
    client.send_to(b"hello", server).unwrap();
    traffic::recv_udp(&listener).unwrap();

    let after = scrape_once(node);
    let spoofed = [("network", network.as_str()), ("reason", DropReason::SpoofedSource.name())];
    let rise = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    assert_eq!(rise("ebpf_cni_drops_total", &spoofed), N as f64, "exactly the spoofed packets");
    assert_eq!(rise("ebpf_cni_dropped_bytes_total", &spoofed), (N * frame.len() as u64) as f64);
    assert_eq!(value(&after, "ebpf_cni_drops_total", &spoofed), node.drops(DropReason::SpoofedSource).unwrap() as f64);
    for reason in DropReason::ALL {
        // The pods' own IPv6 router solicitations may come at any time.
        if ![DropReason::SpoofedSource, DropReason::UnsupportedProtocol].contains(&reason) {
            let labels = [("network", network.as_str()), ("reason", reason.name())];
            assert_eq!(rise("ebpf_cni_drops_total", &labels), 0.0, "{reason:?}");
        }
    }
    assert_eq!(value(&after, "ebpf_cni_nat_entries", &net), 2.0, "one flow: egress and reply");
    // The datagram left masqueraded, as FORWARDED counts it.
    let path = |p: ForwardPath| [("network", network.as_str()), ("path", p.name())];
    let masqueraded = path(ForwardPath::Masqueraded);
    assert_eq!(rise("ebpf_cni_forwarded_packets_total", &masqueraded), 1.0, "one masqueraded datagram");
    assert_eq!(
        value(&after, "ebpf_cni_forwarded_packets_total", &masqueraded),
        node.forwarded(ForwardPath::Masqueraded).unwrap() as f64
    );
    for p in ForwardPath::ALL {
        assert!(prometheus::value(&after, "ebpf_cni_forwarded_bytes_total", &path(p)).is_some(), "{p:?}");
    }
    assert_eq!(value(&after, "ebpf_cni_endpoints", &net), 2.0);

    // Node 2 has a network of its own, without masquerade: its page is its own.
    let node2 = &mut c.nodes[1];
    let pod = node2.new_pod().unwrap();
    node2.add(pod).unwrap();
    let page2 = scrape_once(node2);
    let net2 = [("network", node2.network.as_str())];
    assert_eq!(value(&page2, "ebpf_cni_endpoints", &net2), 1.0);
    assert!(prometheus::value(&page2, "ebpf_cni_endpoints", &net).is_none());
    let (ok, stdout, _) = metrics(&c.nodes[0], &[]);
    assert!(ok);
    eprintln!("ebpf-cni metrics on node 1:\n{stdout}");
}

/// One HTTP/1.1 request from inside `netns`: (status line, headers, body).
/// Scrapes `/metrics` until `done` holds for the parsed page (10 s at most).
fn scrape_until(
    netns: &str,
    at: SocketAddr,
    agent: &RunningAgent,
    what: &str,
    done: impl Fn(&[prometheus::Family]) -> bool,
) -> Vec<prometheus::Family> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((status, headers, body)) = http_get(netns, at, "/metrics") {
            assert_eq!(status, "HTTP/1.1 200 OK", "{headers}\n{body}");
            assert!(headers.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{headers}");
            let families = parse(&body);
            if done(&families) {
                return families;
            }
        }
        assert!(Instant::now() < deadline, "{what}: not seen in 10 s; the agent's log:\n{}", agent.log());
        sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_agent_serves_its_own_series_and_the_datapath() {
    let Some(mut c) =
        Cluster::for_test("the_agent_serves_its_own_series_and_the_datapath", "metra", "10.218.0.0/16", SUBNETS)
    else {
        return;
    };
    let netns = c.nodes[0].node.name.clone();
    // The hand-made route to node 2's pods goes: the agent's route replaces it.
    run_in(&netns, "ip", &["route", "del", SUBNETS[1]]).unwrap();
    let pod = c.nodes[0].new_pod().unwrap();
    c.nodes[0].add(pod).unwrap();
    let network = c.nodes[0].network.clone();
    let nodes_file = c.nodes[0].data_dir().with_file_name("nodes.json");
    let node = |name: &str, cidr: &str, ip: &str| {
        json!({ "metadata": { "name": name }, "spec": { "podCIDR": cidr },
                "status": { "addresses": [{ "type": "InternalIP", "address": ip }] } })
    };
    let list =
        json!({ "items": [node("node-1", SUBNETS[0], UNDERLAY_IPS[0]), node("node-2", SUBNETS[1], UNDERLAY_IPS[1])] });
    std::fs::write(&nodes_file, list.to_string()).unwrap();
    // Loopback of the node's namespace: nothing outside it can reach the port.
    let at: SocketAddr = "127.0.0.1:9962".parse().unwrap();
    let started = now_seconds();
    let mut agent = RunningAgent::start(
        &c.nodes[0],
        "node-1",
        &["--nodes-file", nodes_file.to_str().unwrap(), "--interval", "1", "--metrics-addr", &at.to_string()],
    )
    .unwrap();

    let routes = |f: &[prometheus::Family]| prometheus::value(f, "ebpf_cni_agent_routes", &[]);
    let page = scrape_until(&netns, at, &agent, "the agent's route", |f| routes(f) == Some(1.0));
    let mut want = DATAPATH_FAMILIES.to_vec();
    want.extend(AGENT_FAMILIES);
    assert_eq!(kinds(&page), expected(&want));
    let net = [("network", network.as_str())];
    assert_eq!(prometheus::value(&page, "ebpf_cni_up", &net), Some(1.0));
    assert_eq!(prometheus::value(&page, "ebpf_cni_endpoints", &net), Some(1.0));
    assert_eq!(prometheus::value(&page, "ebpf_cni_agent_sync_errors_total", &[]), Some(0.0));
    let syncs = prometheus::value(&page, "ebpf_cni_agent_syncs_total", &[]).unwrap();
    let last = prometheus::value(&page, "ebpf_cni_agent_last_sync_timestamp_seconds", &[]).unwrap();
    assert!(syncs >= 1.0 && (started - 1.0..=now_seconds() + 1.0).contains(&last), "{syncs} syncs, last at {last}");
    // The route watch goes on beside the metrics thread: more syncs, a later timestamp.
    scrape_until(&netns, at, &agent, "more syncs", |f| {
        prometheus::value(f, "ebpf_cni_agent_syncs_total", &[]).is_some_and(|s| s >= syncs + 2.0)
            && prometheus::value(f, "ebpf_cni_agent_last_sync_timestamp_seconds", &[]).is_some_and(|t| t > last)
    });

    let (status, _, _) = http_get(&netns, at, "/").unwrap();
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (_, _, body) = http_get(&netns, at, "/metrics").unwrap();
    eprintln!("the agent's /metrics:\n{body}");

    // A directory in the root that holds no pins (named to need escaping): up 0, the rest stays.
    let odd = "odd\"na\\me\nx";
    let odd_dir = c.nodes[0].bpffs_root().join(odd);
    std::fs::create_dir(&odd_dir).unwrap();
    let page = scrape_until(&netns, at, &agent, "the odd network", |f| {
        prometheus::value(f, "ebpf_cni_up", &[("network", odd)]).is_some()
    });
    assert_eq!(prometheus::value(&page, "ebpf_cni_up", &[("network", odd)]), Some(0.0));
    assert_eq!(prometheus::value(&page, "ebpf_cni_up", &net), Some(1.0));
    assert!(prometheus::value(&page, "ebpf_cni_endpoints", &[("network", odd)]).is_none());

    // No network left: only the agent's series.
    c.nodes[0].del(pod).unwrap();
    std::fs::remove_dir(&odd_dir).unwrap();
    let page = scrape_until(&netns, at, &agent, "no network", |f| prometheus::value(f, "ebpf_cni_up", &net).is_none());
    assert_eq!(kinds(&page), expected(&AGENT_FAMILIES));
    assert!(agent.child.try_wait().unwrap().is_none(), "the agent is still running: {}", agent.log());
    assert!(agent.log().contains(&format!("serving metrics on http://{at}/metrics")), "{}", agent.log());
}

#[test]
fn errors_are_one_line_and_stdout_stays_clean() {
    let Some(mut node) = Testbed::for_test("errors_are_one_line_and_stdout_stays_clean", "metre", "10.218.9.0/24")
    else {
        return;
    };
    let one_line = |(ok, stdout, stderr): (bool, String, String), want: &str| {
        assert!(!ok && stdout.is_empty(), "{stdout}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("ebpf-cni: ") && stderr.contains(want), "{stderr}");
    };
    one_line(metrics(&node, &[]), "is a pod running?");
    std::fs::create_dir_all(node.bpffs_root()).unwrap();
    one_line(metrics(&node, &[]), "no pod has been added yet");
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    one_line(metrics(&node, &["--network", "nope"]), "\"nope\" has no datapath pinned");
    let network = node.network.clone();
    let (ok, stdout, stderr) = metrics(&node, &["--network", &network]);
    assert!(ok && stderr.is_empty(), "{stderr}");
    assert_eq!(prometheus::value(&parse(&stdout), "ebpf_cni_up", &[("network", &network)]), Some(1.0));

    // Of several networks, one without pins is up 0 and said on stderr; the others are shown.
    std::fs::create_dir(node.bpffs_root().join("stale")).unwrap();
    let (ok, stdout, stderr) = metrics(&node, &[]);
    assert!(ok, "{stderr}");
    assert!(stderr.starts_with("ebpf-cni: network \"stale\": ") && stderr.lines().count() == 1, "{stderr}");
    let page = parse(&stdout);
    assert_eq!(prometheus::value(&page, "ebpf_cni_up", &[("network", "stale")]), Some(0.0));
    assert_eq!(prometheus::value(&page, "ebpf_cni_endpoints", &[("network", &network)]), Some(1.0));
    std::fs::remove_dir(node.bpffs_root().join("stale")).unwrap();
}

/// `ebpf-cni metrics | head -1`: a reader that goes away ends the output quietly.
#[test]
fn a_closed_pipe_ends_the_page_quietly() {
    let Some(mut node) = Testbed::for_test("a_closed_pipe_ends_the_page_quietly", "metrp", "10.218.8.0/24") else {
        return;
    };
    let pod = node.new_pod().unwrap();
    node.add(pod).unwrap();
    let binary = node.plugin.binary.display().to_string();
    let root = node.bpffs_root().display().to_string();
    let out = Command::new("sh")
        .args(["-c", r#""$0" metrics --bpffs-root "$1" | head -1"#, &binary, &root])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.starts_with("# HELP ebpf_cni_up ") && stdout.lines().count() == 1);
    assert!(stderr.is_empty(), "{stderr}");

    // The reader gone before a byte is written: the write itself fails.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = metrics_command(&node, &[]).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{} {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
}

/// A client that opens a request and never ends its headers: one byte a second. Returns how long
/// after connecting the server cut it off, or `None` if it still had not after 10 s.
fn trickle(netns: &str, at: SocketAddr) -> Option<Duration> {
    let mut stream =
        traffic::in_netns(netns, move || Ok(TcpStream::connect_timeout(&at, Duration::from_secs(2))?)).ok()?;
    let connected = Instant::now();
    stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let bytes = b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a'));
    let mut buf = [0u8; 512];
    for byte in bytes {
        if connected.elapsed() > Duration::from_secs(10) {
            return None;
        }
        if stream.write_all(&[*byte]).is_err() {
            return Some(connected.elapsed());
        }
        // The pace: a second of waiting for the server to close (or answer) between two bytes.
        match stream.read(&mut buf) {
            Ok(_) => return Some(connected.elapsed()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(connected.elapsed()),
        }
    }
    unreachable!()
}

/// Issue 24 item 6, the attack: clients on the agent's metrics port that send nothing, or a byte a
/// second without ever ending their headers. Scrapes beside them are answered at once, and each
/// slow client is cut off at the server's whole-request deadline (5 s), however it trickles.
#[test]
fn slow_clients_do_not_hold_the_scrape() {
    let Some(tb) = Testbed::for_test("slow_clients_do_not_hold_the_scrape", "metsl", "10.218.7.0/24") else {
        return;
    };
    let netns = tb.node.name.clone();
    let nodes_file = tb.data_dir().with_file_name("nodes.json");
    let list = json!({ "items": [{ "metadata": { "name": "n1" }, "spec": { "podCIDR": "10.218.7.0/24" },
                                   "status": { "addresses": [{ "type": "InternalIP", "address": UNDERLAY_IPS[0] }] } }] });
    std::fs::write(&nodes_file, list.to_string()).unwrap();
    let no_node_conf = tb.data_dir().with_file_name("no-node.json");
    // Loopback of the node's namespace, as in the test above.
    let at: SocketAddr = "127.0.0.1:9963".parse().unwrap();
    let args = [
        "--nodes-file",
        nodes_file.to_str().unwrap(),
        "--node-conf",
        no_node_conf.to_str().unwrap(),
        "--metrics-addr",
        &at.to_string(),
    ];
    let agent = RunningAgent::start(&tb, "n1", &args).unwrap();
    scrape_until(&netns, at, &agent, "a first page", |_| true);

    // One client that connects and says nothing, four that trickle.
    let silent = traffic::in_netns(&netns, move || Ok(TcpStream::connect(at)?)).unwrap();
    let silent_since = Instant::now();
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let netns = netns.clone();
            std::thread::spawn(move || trickle(&netns, at))
        })
        .collect();
    sleep(Duration::from_millis(1500));
    let scrapes: Vec<_> = (0..4)
        .map(|_| {
            let netns = netns.clone();
            std::thread::spawn(move || {
                let asked = Instant::now();
                (http_get(&netns, at, "/metrics").map(|(status, _, _)| status), asked.elapsed())
            })
        })
        .collect();
    for scrape in scrapes {
        let (status, took) = scrape.join().unwrap();
        eprintln!("a scrape beside 5 slow clients: {status:?} in {took:?}");
        assert_eq!(status.ok().as_deref(), Some("HTTP/1.1 200 OK"), "after {took:?}: {}", agent.log());
        assert!(took < Duration::from_secs(1), "the scrape took {took:?} beside slow clients");
    }
    for client in slow {
        let cut = client.join().unwrap();
        eprintln!("a trickling client was cut off after {cut:?}");
        assert!(cut.is_some_and(|d| d <= Duration::from_secs(6)), "a trickling client was kept {cut:?}");
    }
    let mut silent = silent;
    let left = Duration::from_secs(6).saturating_sub(silent_since.elapsed());
    silent.set_read_timeout(Some(left.max(Duration::from_millis(100)))).unwrap();
    let closed = silent.read(&mut [0u8; 64]);
    let kept = silent_since.elapsed();
    eprintln!("the silent client was cut off after {kept:?} ({closed:?})");
    assert!(matches!(closed, Ok(0)) && kept <= Duration::from_secs(6), "the silent client: {closed:?} after {kept:?}");
}
