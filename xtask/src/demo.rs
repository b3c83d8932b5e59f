//! The demo: a throwaway node with three pods, driven exactly as a runtime drives the plugin.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use ebpf_cni_tests::{NODE_IP, Plugin, Testbed, require_privileges, run_in};

const PODS: usize = 3;

pub fn run(binary: PathBuf) -> Result<()> {
    if !require_privileges("demo") {
        bail!("the demo creates network namespaces and loads eBPF: run it as root");
    }
    let mut tb = Testbed::with_plugin("demo", "10.244.0.0/24", Plugin { binary })?;
    println!("== node namespace {} (node address {NODE_IP}), bpffs {}", tb.node.name, tb.bpffs_root().display());
    println!("== network configuration (stdin of every call)\n{}", serde_json::to_string_pretty(&tb.conf("1.0.0"))?);

    let mut ips = Vec::new();
    let mut add_ms = Vec::new();
    for _ in 0..PODS {
        let pod = tb.new_pod()?;
        let out = tb.cni("ADD", pod, &tb.conf("1.0.0"))?;
        ensure!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
        add_ms.push(out.elapsed.as_secs_f64() * 1e3);
        println!("\n== ADD {} (netns {}) in {:.1} ms", tb.pods[pod].container_id, tb.pods[pod].netns.name, add_ms[pod]);
        println!("{}", serde_json::to_string_pretty(&out.json())?);
        let address = out.json()["ips"][0]["address"].as_str().context("no address")?.to_string();
        ips.push(address.split('/').next().unwrap_or_default().to_string());
    }

    println!("\n== ping (pod -> pod, pod -> node, node -> pod)");
    for (from, pod) in tb.pods.iter().enumerate() {
        let mut targets: Vec<(String, &str)> = ips
            .iter()
            .enumerate()
            .filter(|(to, _)| *to != from)
            .map(|(to, ip)| (format!("pod{to}"), ip.as_str()))
            .collect();
        targets.push(("node".into(), NODE_IP));
        for (name, ip) in targets {
            let ok = tb.ping(&pod.netns.name, ip);
            println!("pod{from} -> {name:5} {ip:15} {}", if ok { "ok" } else { "FAILED" });
            ensure!(ok, "pod{from} cannot reach {name}");
        }
        ensure!(tb.ping(&tb.node.name, &ips[from]), "node cannot reach pod{from}");
        println!("node -> pod{from}  {:15} ok", ips[from]);
    }

    println!("\n== iperf3 pod0 -> pod1, 3 s, TCP (same-node path: from_pod + bpf_redirect_peer)");
    iperf3(&tb.pods[1].netns.name, &tb.pods[0].netns.name, &ips[1])?;

    for map in ["ENDPOINTS", "METRICS"] {
        let pin = tb.map_pin(map);
        println!("\n== bpftool map dump pinned {}", pin.display());
        let out = ebpf_cni_tests::run("bpftool", &["map", "dump", "pinned", pin.to_str().context("path")?])?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }

    let mut del_ms = Vec::new();
    println!();
    for pod in 0..PODS {
        let out = tb.cni("DEL", pod, &tb.conf("1.0.0"))?;
        ensure!(out.success, "DEL failed: {}", out.stdout);
        del_ms.push(out.elapsed.as_secs_f64() * 1e3);
        println!("== DEL {} in {:.1} ms", tb.pods[pod].container_id, del_ms[pod]);
    }

    let left = tb.leftovers()?;
    println!("\n== after DEL: host veths, IP files, pins left: {left:?}");
    ensure!(left.is_empty(), "DEL left something behind");
    println!("nothing left");
    println!(
        "\n== wall time per call (plugin process, as a runtime sees it): ADD {} ms, DEL {} ms",
        list(&add_ms),
        list(&del_ms)
    );
    println!("(the first ADD loads and pins the programs; later ADDs reuse them)");
    Ok(())
}

fn list(ms: &[f64]) -> String {
    ms.iter().map(|m| format!("{m:.1}")).collect::<Vec<_>>().join(" / ")
}

/// Runs an iperf3 server in `server_ns` (killed by its PID afterwards) and a client in `client_ns`.
fn iperf3(server_ns: &str, client_ns: &str, server_ip: &str) -> Result<()> {
    let mut server = Command::new("nsenter")
        .args([&format!("--net=/run/netns/{server_ns}"), "iperf3", "-s", "-1"])
        .stdout(Stdio::null())
        .spawn()
        .context("starting iperf3 server")?;
    sleep(Duration::from_millis(300));
    let client = run_in(client_ns, "iperf3", &["-c", server_ip, "-t", "3", "-f", "g"]);
    let _ = server.kill();
    let _ = server.wait();
    let client = client?;
    let text = String::from_utf8_lossy(&client.stdout);
    for line in text.lines().filter(|l| l.contains("sender") || l.contains("receiver")) {
        println!("{line}");
    }
    Ok(())
}
