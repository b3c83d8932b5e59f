//! The demo: a throwaway dual-stack two-node cluster with an external server, pods added
//! exactly as a runtime adds them (CNI_* environment, configuration on stdin, in the node's
//! namespace), each with an IPv4 and an IPv6 address.
use std::{
    net::{SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener},
    path::PathBuf,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use ebpf_cni_tests::{
    Cluster, EXT_SERVER, EXT_SERVER_V6, NODE1_UPLINK_IP, NODE1_UPLINK_IPV6, Plugin, Testbed, run_in,
    traffic::{self, ask_tcp, serve_tcp},
};
use serde_json::Value;

/// Pods per node: two on node 1 (same-node path), one on node 2 (cross-node path).
const PODS: [usize; 2] = [2, 1];

/// Checked before anything is installed or built, so a missing privilege costs no build.
pub fn require_root() -> Result<()> {
    if !ebpf_cni_tests::is_root() {
        bail!("the demo creates network namespaces and loads eBPF: run it as root");
    }
    Ok(())
}

pub fn run(binary: PathBuf, hold: bool) -> Result<()> {
    let plugin = Plugin { binary: binary.clone() };
    let mut c = Cluster::with_plugin("demo", "10.244.0.0/16", ["10.244.1.0/24", "10.244.2.0/24"], plugin)?;
    c.add_ipv6("fd00:10:244::/56", ["fd00:10:244:1::/64", "fd00:10:244:2::/64"])?;
    // Node 1's programs log new masqueraded flows (read below with `inspect logs`).
    c.nodes[0].extra.insert("ebpfLogLevel".into(), serde_json::json!("info"));
    println!(
        "== node 1 {} (uplink {NODE1_UPLINK_IP} and {NODE1_UPLINK_IPV6} to {}, server {EXT_SERVER} and {EXT_SERVER_V6})",
        c.nodes[0].node.name, c.ext.name
    );
    println!("== node 2 {} (underlay to node 1, route to each other's pod subnet)", c.nodes[1].node.name);
    println!(
        "== node 1's configuration (stdin of every call)\n{}",
        serde_json::to_string_pretty(&c.nodes[0].conf("1.1.0"))?
    );

    let mut ips: Vec<(usize, String, [String; 2])> = Vec::new(); // (node, pod netns, [IPv4, IPv6])
    let mut results: Vec<Vec<Value>> = vec![Vec::new(), Vec::new()]; // ADD results per node
    let mut add_ms = Vec::new();
    for (n, node) in c.nodes.iter_mut().enumerate() {
        for _ in 0..PODS[n] {
            let pod = node.new_pod()?;
            let out = node.cni("ADD", pod, &node.conf("1.1.0"))?;
            ensure!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
            add_ms.push(out.elapsed.as_secs_f64() * 1e3);
            let address = |i: usize| -> Result<String> {
                let cidr = out.json()["ips"][i]["address"].as_str().context("an address of each family")?.to_string();
                Ok(cidr.split('/').next().unwrap_or_default().into())
            };
            let addresses = [address(0)?, address(1)?];
            results[n].push(out.json());
            println!("\n== ADD on node {} in {:.1} ms: {}", n + 1, add_ms[add_ms.len() - 1], addresses.join(", "));
            if ips.is_empty() {
                println!("{}", serde_json::to_string_pretty(&out.json())?);
            }
            ips.push((n, node.pods[pod].netns.name.clone(), addresses));
        }
    }

    println!("\n== ping between every pair of pods, and from each node to every pod, over IPv4 and IPv6");
    for family in 0..2 {
        for (from_node, from_ns, from) in &ips {
            for (to_node, _, to) in ips.iter().filter(|(_, ns, _)| ns != from_ns) {
                let (from_ip, to_ip) = (&from[family], &to[family]);
                let ok = c.nodes[0].ping(from_ns, to_ip);
                println!(
                    "pod {from_ip:18} (node {}) -> pod {to_ip:18} (node {}) {}",
                    from_node + 1,
                    to_node + 1,
                    verdict(ok)
                );
                ensure!(ok, "{from_ip} cannot reach {to_ip}");
            }
        }
    }
    for (n, node) in c.nodes.iter().enumerate() {
        for ip in ips.iter().flat_map(|(_, _, addresses)| addresses) {
            ensure!(node.ping(&node.node.name, ip), "node {} cannot reach {ip}", n + 1);
        }
        println!("node {} -> every pod, both families ok", n + 1);
    }

    let pod_ns = ips[0].1.clone();
    println!("\n== masquerade: pod {} -> {EXT_SERVER} (ext has no route to any pod)", ips[0].2[0]);
    let seen = seen_by_server(&c.ext.name, &pod_ns, SocketAddrV4::new(EXT_SERVER.parse()?, 8080).into())?;
    println!("TCP: the server saw the pod as {seen}");
    ensure!(c.nodes[0].ping(&pod_ns, EXT_SERVER), "ping through masquerade failed");
    println!("ping: ok");
    println!("\n== IPv6 masquerade: pod {} -> {EXT_SERVER_V6}", ips[0].2[1]);
    let seen = seen_by_server(&c.ext.name, &pod_ns, SocketAddrV6::new(EXT_SERVER_V6.parse()?, 8080, 0, 0).into())?;
    println!("TCP: the server saw the pod as {seen}");
    ensure!(c.nodes[0].ping(&pod_ns, EXT_SERVER_V6), "ping through IPv6 masquerade failed");
    println!("ping: ok");
    iperf3(&c.ext.name, &pod_ns, EXT_SERVER)?;

    let node1 = &c.nodes[0];
    let inspect_args = inspect_args(node1);
    for view in ["endpoints", "nat", "counters", "settings", "programs", "logs"] {
        println!("\n== ebpf-cni inspect {view} {}", inspect_args.join(" "));
        let mut args = vec!["inspect", view];
        args.extend(inspect_args.iter().map(String::as_str));
        let out = ebpf_cni_tests::run(binary.to_str().context("path")?, &args)?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    print_metrics(&binary, node1)?;
    for map in ["SETTINGS", "NAT", "ENDPOINTS", "METRICS"] {
        let pin = node1.map_pin(map);
        println!("\n== bpftool map dump pinned {}", pin.display());
        let out = ebpf_cni_tests::run("bpftool", &["map", "dump", "pinned", pin.to_str().context("path")?])?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    if hold {
        hold_for_user(&binary, node1, &inspect_args)?;
    }
    let rules = run_in(&node1.node.name, "iptables-save", &[])?;
    let rules = String::from_utf8_lossy(&rules.stdout).lines().filter(|l| l.starts_with("-A")).count();
    let bridges = run_in(&node1.node.name, "ip", &["-o", "link", "show", "type", "bridge"])?;
    let bridges = String::from_utf8_lossy(&bridges.stdout).lines().count();
    println!("\n== in node 1: {rules} iptables rules, {bridges} bridges");
    ensure!(rules == 0 && bridges == 0, "the node has rules or bridges");

    check_status_gc(&c.nodes[0], &results[0])?;

    let mut del_ms = Vec::new();
    for node in &c.nodes {
        for pod in 0..node.pods.len() {
            let out = node.cni("DEL", pod, &node.conf("1.1.0"))?;
            ensure!(out.success, "DEL failed: {}", out.stdout);
            del_ms.push(out.elapsed.as_secs_f64() * 1e3);
        }
    }
    let left: Vec<String> = c.nodes.iter().map(Testbed::leftovers).collect::<Result<Vec<_>>>()?.concat();
    println!("\n== after DEL: host veths, IP files, pins left: {left:?}");
    ensure!(left.is_empty(), "DEL left something behind");
    println!("nothing left");
    println!(
        "\n== wall time per call (plugin process, as a runtime sees it): ADD {} ms, DEL {} ms",
        list(&add_ms),
        list(&del_ms)
    );
    println!("(the first ADD on each node loads and pins the programs; later ADDs reuse them)");
    Ok(())
}

/// The spec 1.1 verbs no runtime on this machine sends: CHECK of node 1's pods against their
/// ADD results, STATUS, and GC after a pod's sandbox vanished without a DEL.
fn check_status_gc(node: &Testbed, results: &[Value]) -> Result<()> {
    println!("\n== CHECK, STATUS and GC on node 1 (spec 1.1.0)");
    for (pod, result) in results.iter().enumerate() {
        let mut conf = node.conf("1.1.0");
        conf["prevResult"] = result.clone();
        let out = node.cni("CHECK", pod, &conf)?;
        ensure!(out.success, "CHECK failed: {}", out.stdout);
        println!("CHECK pod {}: ok (interfaces, addresses, routes, tc filter, program, endpoint, reservation)", pod);
    }
    let out =
        node.cni_raw(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")], &node.conf("1.1.0").to_string())?;
    ensure!(out.success, "STATUS failed: {}", out.stdout);
    println!("STATUS: ok (bpffs, BTF, kernel, IP pool, data dir)");
    let gone = node.pods.len() - 1;
    ebpf_cni_tests::run("ip", &["netns", "del", &node.pods[gone].netns.name])?;
    println!("pod {gone}'s sandbox vanished without a DEL; GC with the other pods as valid attachments:");
    let valid: Vec<Value> =
        (0..gone).map(|p| serde_json::json!({ "containerID": node.pods[p].container_id, "ifname": "eth0" })).collect();
    let mut conf = node.conf("1.1.0");
    conf["cni.dev/valid-attachments"] = Value::Array(valid);
    conf["logLevel"] = Value::from("info"); // GC says what it removed at info level
    let out = node.cni_raw(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")], &conf.to_string())?;
    ensure!(out.success, "GC failed: {}", out.stdout);
    println!("{}", out.stderr.trim());
    Ok(())
}

/// A few lines of node 1's `ebpf-cni metrics` page: the packets forwarded by path and the drops
/// that happened, endpoints, NAT.
fn print_metrics(binary: &std::path::Path, node: &Testbed) -> Result<()> {
    let root = node.bpffs_root().display().to_string();
    let args = ["metrics", "--network", &node.network, "--bpffs-root", &root];
    println!("\n== ebpf-cni {} (packets by path, non-zero drops, endpoints, NAT entries)", args.join(" "));
    let out = ebpf_cni_tests::run(binary.to_str().context("path")?, &args)?;
    let page = String::from_utf8_lossy(&out.stdout);
    let shown = page.lines().filter(|l| {
        let drop = (l.starts_with("ebpf_cni_drops_total") || l.starts_with("ebpf_cni_dropped_bytes_total"))
            && !l.ends_with(" 0");
        let counted = ["ebpf_cni_forwarded_packets_total", "ebpf_cni_endpoints{", "ebpf_cni_nat_entries{"];
        drop || counted.iter().any(|prefix| l.starts_with(prefix))
    });
    for line in shown {
        println!("{line}");
    }
    Ok(())
}

/// Where `inspect` finds node 1's datapath: its bpffs root and network namespace.
fn inspect_args(node: &Testbed) -> Vec<String> {
    vec![
        "--network".into(),
        node.network.clone(),
        "--bpffs-root".into(),
        node.bpffs_root().display().to_string(),
        "--netns".into(),
        format!("/run/netns/{}", node.node.name),
    ]
}

/// `--hold`: the cluster stays up while the user looks at it from another terminal.
fn hold_for_user(binary: &std::path::Path, node: &Testbed, inspect_args: &[String]) -> Result<()> {
    println!("\n== the demo is held: from another terminal, as root, try");
    for view in ["endpoints", "nat", "counters", "programs", "logs --follow"] {
        println!("  {} inspect {view} {}", binary.display(), inspect_args.join(" "));
    }
    println!("  {} metrics --network {} --bpffs-root {}", binary.display(), node.network, node.bpffs_root().display());
    for map in ["ENDPOINTS", "NAT", "METRICS", "SETTINGS"] {
        println!("  bpftool map dump pinned {}", node.map_pin(map).display());
    }
    println!("  nsenter --net=/run/netns/{} ip route", node.node.name);
    println!("press Enter to go on (DEL every pod, check nothing is left, remove the namespaces)");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(())
}

/// One TCP connection from `pod_ns` to a server at `at` in `ext_ns`: the address it saw.
fn seen_by_server(ext_ns: &str, pod_ns: &str, at: SocketAddr) -> Result<String> {
    let listener = traffic::in_netns(ext_ns, move || Ok(TcpListener::bind(at)?))?;
    let served = serve_tcp(listener, 1);
    let seen = ask_tcp(&mut traffic::tcp_connect(pod_ns, 0, at)?)?;
    served.join().map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    Ok(seen)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "FAILED" }
}

fn list(ms: &[f64]) -> String {
    ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(" / ")
}

/// A 3 s iperf3 run from the pod to the external server (killed by its PID afterwards).
fn iperf3(server_ns: &str, client_ns: &str, server_ip: &str) -> Result<()> {
    let mut server = Command::new("nsenter")
        .args([&format!("--net=/run/netns/{server_ns}"), "iperf3", "-s", "-1", "-B", server_ip])
        .stdout(Stdio::null())
        .spawn()
        .context("starting iperf3 server")?;
    sleep(Duration::from_millis(300));
    let client = run_in(client_ns, "iperf3", &["-c", server_ip, "-t", "3", "-f", "g"]);
    let _ = server.kill();
    let _ = server.wait();
    let client = client?;
    println!("iperf3 pod -> external, 3 s (an illustration; `cargo xtask bench` compares with bridge):");
    for line in
        String::from_utf8_lossy(&client.stdout).lines().filter(|l| l.contains("sender") || l.contains("receiver"))
    {
        println!("{line}");
    }
    Ok(())
}
