//! The node under test: node namespace, pods, private bpffs and data dir.
use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::{
    guard::{Bpffs, NetnsGuard, run, run_in},
    plugin::{CniOutput, Plugin},
    runtime::Sandbox,
};

/// MTU the test configuration asks for (not the kernel's default, so a test can see it applied).
pub const TEST_MTU: u32 = 1450;

/// The node's address inside its namespace.
pub const NODE_IP: &str = "10.255.255.1";

static RUNS: AtomicU32 = AtomicU32::new(0);

/// A pod: its namespace and the container ID the runtime would use for it.
pub struct Pod {
    pub netns: NetnsGuard,
    pub container_id: String,
}

impl Pod {
    pub fn netns_path(&self) -> String {
        self.netns.path().display().to_string()
    }
}

/// A pod after ADD, as the programs see it.
#[derive(Clone, Debug)]
pub struct Attached {
    pub ip: std::net::Ipv4Addr,
    pub pod_mac: [u8; 6],
    pub host_mac: [u8; 6],
    pub host_ifname: String,
}

/// Fields drop in order: pods, then the node, then the bpffs mount and data dir.
pub struct Testbed {
    pub pods: Vec<Pod>,
    pub node: NetnsGuard,
    pub plugin: Plugin,
    pub network: String,
    pub subnet: String,
    pub run_id: String,
    /// Extra top-level fields of every configuration [`Self::conf`] writes.
    pub extra: serde_json::Map<String, Value>,
    /// The mount namespace the plugin runs in, when not the test's own (`/proc/<pid>/ns/mnt`).
    pub mount_ns: Option<PathBuf>,
    bpffs: Bpffs,
}

impl Testbed {
    /// The testbed for test `name`, or `None` when the test must be skipped (not root, off CI;
    /// under `CI=true` it panics instead, see [`crate::require_privileges`]).
    pub fn for_test(name: &str, tag: &str, subnet: &str) -> Option<Self> {
        crate::require_privileges(name).then(|| Self::new(tag, subnet).expect("building the test node"))
    }

    /// A node namespace named `ecni-<tag>-<pid>-<n>` with its own bpffs and IPAM dir.
    pub fn new(tag: &str, subnet: &str) -> Result<Self> {
        Self::with_plugin(tag, subnet, Plugin::from_env()?)
    }

    pub fn with_plugin(tag: &str, subnet: &str, plugin: Plugin) -> Result<Self> {
        let run_id = format!("ecni-{tag}-{}-{}", std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed));
        let bpffs = Bpffs::mount(&std::env::temp_dir().join(&run_id))?;
        let node = NetnsGuard::create(&format!("{run_id}-node"))?;
        // The node's own address (kubelet probes come from it); lives only in this namespace.
        run_in(&node.name, "ip", &["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])?;
        Ok(Self {
            pods: Vec::new(),
            node,
            plugin,
            network: format!("net-{tag}"),
            subnet: subnet.to_string(),
            run_id,
            extra: serde_json::Map::new(),
            mount_ns: None,
            bpffs,
        })
    }

    /// Creates the namespace of pod number `pods.len()` and returns its index.
    pub fn new_pod(&mut self) -> Result<usize> {
        let index = self.pods.len();
        let netns = NetnsGuard::create(&format!("{}-p{index}", self.run_id))?;
        self.pods.push(Pod { netns, container_id: format!("{}-c{index}", self.run_id) });
        Ok(index)
    }

    pub fn bpffs_root(&self) -> PathBuf {
        self.bpffs.mount_point().join("ebpf-cni")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.bpffs.base.join("ipam")
    }

    /// The network's pins: `<bpffs>/ebpf-cni/<network>`.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs_root().join(&self.network)
    }

    /// `<pin dir>/v<N>`, N being the pinned layout version.
    pub fn version_dir(&self) -> PathBuf {
        self.pin_dir().join(format!("v{}", ebpf_common::PIN_LAYOUT_VERSION))
    }

    /// The version directory the network's programs are pinned in: this build's layout, or
    /// the previous one's while the plugin under test is a release of it (benchmarks of a
    /// release run its programs through these helpers too).
    pub fn loaded_version_dir(&self) -> PathBuf {
        let own = self.version_dir();
        let previous = self.pin_dir().join(format!("v{}", ebpf_common::PIN_LAYOUT_VERSION - 1));
        if !own.exists() && previous.exists() { previous } else { own }
    }

    pub fn map_pin(&self, map: &str) -> PathBuf {
        self.version_dir().join("maps").join(map)
    }

    /// The network configuration a runtime would pass, in the given spec version.
    pub fn conf(&self, version: &str) -> Value {
        let mut conf = json!({
            "cniVersion": version,
            "name": self.network,
            "type": "ebpf-cni",
            "mtu": TEST_MTU,
            "bpffsRoot": self.bpffs_root(),
            "ipam": { "type": "host-local", "subnet": self.subnet, "dataDir": self.data_dir() },
        });
        for (key, value) in &self.extra {
            conf[key] = value.clone();
        }
        conf
    }

    /// The same configuration as a one-plugin conflist, with `chained` plugins after ours.
    pub fn conflist(&self, version: &str, chained: Vec<Value>) -> Value {
        let mut ours = self.conf(version);
        let object = ours.as_object_mut().expect("conf is an object");
        object.remove("name");
        object.remove("cniVersion");
        let mut plugins = vec![ours];
        plugins.extend(chained);
        json!({ "cniVersion": version, "name": self.network, "plugins": plugins })
    }

    /// The runtime's view of `pod`'s attachment (ifname eth0, its netns if it exists).
    pub fn sandbox(&self, pod: usize) -> Sandbox {
        let netns = self.pods[pod].netns_path();
        Sandbox {
            container_id: self.pods[pod].container_id.clone(),
            ifname: "eth0".into(),
            netns: if std::path::Path::new(&netns).exists() { netns } else { String::new() },
            ..Sandbox::default()
        }
    }

    /// Host veths whose ingress runs `from_pod` in a tc filter, as bpftool lists them.
    pub fn from_pod_filters(&self) -> Result<Vec<String>> {
        Ok(self.from_pod_filter_programs()?.into_iter().map(|(dev, _)| dev).collect())
    }

    /// Each `from_pod` filter's device and program id (one id: the program was loaded once).
    pub fn from_pod_filter_programs(&self) -> Result<Vec<(String, u64)>> {
        let out = run_in(&self.node.name, "bpftool", &["-j", "net", "show"])?;
        let net: Value = serde_json::from_slice(&out.stdout).context("bpftool net show -j")?;
        let filters = net.get(0).and_then(|n| n["tc"].as_array()).cloned().unwrap_or_default();
        Ok(filters
            .iter()
            .filter(|f| f["kind"] == "clsact/ingress" && f["name"] == "from_pod")
            .filter_map(|f| Some((f["devname"].as_str()?.to_string(), f["id"].as_u64()?)))
            .collect())
    }

    /// Entries of a pinned map (0 once the network's pins are gone).
    pub fn map_len(&self, map: &str) -> Result<usize> {
        Ok(self.map_dump_if_pinned(map)?.as_array().map_or(0, Vec::len))
    }

    /// Runs one verb for `pod` (ifname eth0) with `conf` on stdin, as kubelet does: CNI_NETNS
    /// set while the pod's namespace exists.
    pub fn cni(&self, command: &str, pod: usize, conf: &Value) -> Result<CniOutput> {
        let netns = self.pods[pod].netns_path();
        let netns = if std::path::Path::new(&netns).exists() { netns } else { String::new() };
        self.cni_with_netns(command, pod, conf, &netns)
    }

    /// Like [`Self::cni`] with an explicit CNI_NETNS (containerd sends DEL with an empty one).
    pub fn cni_with_netns(&self, command: &str, pod: usize, conf: &Value, netns: &str) -> Result<CniOutput> {
        self.cni_env(command, pod, conf, netns, &[])
    }

    /// Like [`Self::cni_with_netns`] with more variables (`CNI_ARGS`, `EBPF_CNI_DIE_AT`…).
    pub fn cni_env(
        &self,
        command: &str,
        pod: usize,
        conf: &Value,
        netns: &str,
        more: &[(&str, &str)],
    ) -> Result<CniOutput> {
        let env = self.verb_env(command, pod, netns, more);
        self.cni_raw(&env, &conf.to_string())
    }

    /// Like [`Self::cni`], the plugin sent SIGKILL `after` it started if still running then
    /// (`killed_by` tells whether it was).
    pub fn cni_killed_after(
        &self,
        command: &str,
        pod: usize,
        conf: &Value,
        more: &[(&str, &str)],
        after: Duration,
    ) -> Result<CniOutput> {
        let netns = self.sandbox(pod).netns;
        let env = self.verb_env(command, pod, &netns, more);
        self.plugin.exec_killed_after(&self.node.name, &env, &conf.to_string(), after)
    }

    fn verb_env<'a>(
        &'a self,
        command: &'a str,
        pod: usize,
        netns: &'a str,
        more: &[(&'a str, &'a str)],
    ) -> Vec<(&'a str, &'a str)> {
        let pod = &self.pods[pod];
        let mut env = vec![
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", pod.container_id.as_str()),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ];
        env.extend_from_slice(more);
        env
    }

    pub fn cni_raw(&self, env: &[(&str, &str)], stdin: &str) -> Result<CniOutput> {
        match &self.mount_ns {
            Some(mnt) => self.plugin.exec_in(&self.node.name, mnt, env, stdin),
            None => self.plugin.exec(&self.node.name, env, stdin),
        }
    }

    /// GC (spec 1.1.0) that must succeed, with the attachments (`eth0`) of `valid` pods valid.
    pub fn gc(&self, valid: &[usize]) -> Result<()> {
        let mut conf = self.conf("1.1.0");
        let attachments: Vec<Value> = valid
            .iter()
            .map(|&p| serde_json::json!({"containerID": self.pods[p].container_id, "ifname": "eth0"}))
            .collect();
        conf["cni.dev/valid-attachments"] = Value::Array(attachments);
        let out = self.cni("GC", valid.first().copied().unwrap_or(0), &conf)?;
        anyhow::ensure!(out.success, "GC failed: {} {}", out.stdout, out.stderr);
        Ok(())
    }

    /// Like [`Self::gc`], the plugin's own summary of what it removed (its log line at level
    /// info, in a log file beside the data dir).
    pub fn gc_report(&self, valid: &[usize]) -> Result<String> {
        let log = self.data_dir().with_file_name("gc.log");
        let mut conf = self.conf("1.1.0");
        let attachments: Vec<Value> =
            valid.iter().map(|&p| json!({"containerID": self.pods[p].container_id, "ifname": "eth0"})).collect();
        conf["cni.dev/valid-attachments"] = Value::Array(attachments);
        conf["logLevel"] = json!("info");
        conf["logFile"] = json!(log);
        let out = self.cni("GC", valid.first().copied().unwrap_or(0), &conf)?;
        anyhow::ensure!(out.success, "GC failed: {} {}", out.stdout, out.stderr);
        let text = std::fs::read_to_string(&log).context("reading the GC's log")?;
        let line = text.lines().rev().find(|l| l.contains("GC of")).context("no GC summary in the log")?;
        Ok(line.split_once("GC of").map_or(line, |(_, rest)| rest).trim().to_string())
    }

    /// Routes in the node to addresses of the pod subnet (a /32 per pod).
    pub fn pod_routes(&self) -> Result<Vec<String>> {
        let out = run_in(&self.node.name, "ip", &["-o", "route", "show", "root", &self.subnet])?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).collect())
    }

    /// ADD in spec 1.0.0 that must succeed; returns the pod's address without prefix.
    pub fn add(&self, pod: usize) -> Result<String> {
        let out = self.cni("ADD", pod, &self.conf("1.0.0"))?;
        anyhow::ensure!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
        let address = out.json()["ips"][0]["address"].as_str().context("no address")?.to_string();
        Ok(address.split('/').next().unwrap_or_default().to_string())
    }

    /// ADD (spec 1.1.0) that must succeed; returns what the programs know of the pod.
    pub fn add_attachment(&self, pod: usize) -> Result<Attached> {
        let out = self.cni("ADD", pod, &self.conf("1.1.0"))?;
        anyhow::ensure!(out.success, "ADD failed: {} {}", out.stdout, out.stderr);
        let result = out.json();
        let text = |v: &Value| v.as_str().map(str::to_string).context("missing field in the ADD result");
        let mac = |v: &Value| -> Result<[u8; 6]> {
            let bytes: Vec<u8> = text(v)?.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>()?;
            bytes.try_into().map_err(|_| anyhow::anyhow!("MAC of the wrong length"))
        };
        let address = text(&result["ips"][0]["address"])?;
        Ok(Attached {
            ip: address.split('/').next().unwrap_or_default().parse()?,
            pod_mac: mac(&result["interfaces"][1]["mac"])?,
            host_mac: mac(&result["interfaces"][0]["mac"])?,
            host_ifname: text(&result["interfaces"][0]["name"])?,
        })
    }

    /// `count` new pods, each ADDed (spec 1.1.0); what the programs know of them.
    pub fn add_attachments(&mut self, count: usize) -> Result<Vec<Attached>> {
        (0..count)
            .map(|_| {
                let pod = self.new_pod()?;
                self.add_attachment(pod)
            })
            .collect()
    }

    pub fn del(&self, pod: usize) -> Result<()> {
        self.del_with_netns(pod, &self.pods[pod].netns_path())
    }

    /// DEL as containerd sends it when the sandbox is already gone: empty CNI_NETNS.
    pub fn del_without_netns(&self, pod: usize) -> Result<()> {
        self.del_with_netns(pod, "")
    }

    fn del_with_netns(&self, pod: usize, netns: &str) -> Result<()> {
        let out = self.cni_with_netns("DEL", pod, &self.conf("1.0.0"), netns)?;
        anyhow::ensure!(out.success, "DEL failed: {} {}", out.stdout, out.stderr);
        Ok(())
    }

    /// One ping from a namespace, one second to answer.
    pub fn ping(&self, from_netns: &str, ip: &str) -> bool {
        run_in(from_netns, "ping", &["-c", "1", "-W", "1", ip]).is_ok()
    }

    /// IPv4 packets the node's kernel has forwarded (`Ip: ForwDatagrams` of /proc/net/snmp).
    /// Packets the programs redirect themselves do not count.
    pub fn kernel_forwarded(&self) -> Result<u64> {
        let out = run_in(&self.node.name, "cat", &["/proc/net/snmp"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut ip_lines = text.lines().filter(|l| l.starts_with("Ip:"));
        let (names, values) = (ip_lines.next().context("no Ip: header")?, ip_lines.next().context("no Ip: values")?);
        let column = names.split_whitespace().position(|n| n == "ForwDatagrams").context("no ForwDatagrams")?;
        Ok(values.split_whitespace().nth(column).context("short Ip: line")?.parse()?)
    }

    /// Interfaces the plugin made in the node (host ends are named `ecni…`).
    pub fn host_veths(&self) -> Result<Vec<String>> {
        let out = run_in(&self.node.name, "ip", &["-o", "link", "show"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("ecni"))
            .collect())
    }

    /// The IFB devices of pods' egress limits in the node (`ecnb…`).
    pub fn ifbs(&self) -> Result<Vec<String>> {
        let out = run_in(&self.node.name, "ip", &["-o", "link", "show", "type", "ifb"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .filter(|n| n.starts_with("ecnb"))
            .map(str::to_string)
            .collect())
    }

    /// Reserved addresses in the IPAM dir (files named like an IPv4 or IPv6 address).
    pub fn ip_files(&self) -> Vec<String> {
        std::fs::read_dir(self.data_dir().join(&self.network))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What the plugin left in this node: host veths, IFBs, routes to pods, IP reservations, the
    /// network's pins.
    /// Empty once every attachment is deleted.
    pub fn leftovers(&self) -> Result<Vec<String>> {
        let mut left: Vec<String> = self.host_veths()?.into_iter().map(|v| format!("veth {v}")).collect();
        left.extend(self.ifbs()?.into_iter().map(|i| format!("IFB {i}")));
        left.extend(self.pod_routes()?.into_iter().map(|r| format!("route {r}")));
        left.extend(self.ip_files().into_iter().map(|ip| format!("IP file {ip}")));
        // Anything else in the IPAM dir but its lock and round-robin records (a temporary
        // reservation a crashed writer left, say), and anything in its directories of files
        // written aside and of the attachments' records.
        let dir = self.data_dir().join(&self.network);
        let names = |dir: &std::path::Path| -> Vec<String> {
            let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
            entries.filter_map(|e| e.file_name().into_string().ok()).collect()
        };
        left.extend(
            names(&dir).into_iter().filter(|n| n.starts_with('.') && n != ".aside").map(|n| format!("IPAM file {n}")),
        );
        for sub in [".aside", "attachments"] {
            left.extend(names(&dir.join(sub)).into_iter().map(|n| format!("IPAM file {sub}/{n}")));
        }
        if self.pin_dir().exists() {
            left.push(format!("pins {}", self.pin_dir().display()));
        }
        Ok(left)
    }

    /// `bpftool map dump pinned …` as JSON: BTF-formatted entries with field names.
    pub fn map_dump(&self, map: &str) -> Result<Value> {
        let pin = self.map_pin(map);
        let out = run("bpftool", &["-j", "map", "dump", "pinned", pin.to_str().context("path")?])?;
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Like [`Self::map_dump`], but an empty list once the network's pins are gone.
    pub fn map_dump_if_pinned(&self, map: &str) -> Result<Value> {
        if !self.map_pin(map).exists() {
            return Ok(Value::Array(Vec::new()));
        }
        self.map_dump(map)
    }

    /// Deletes the `ENDPOINTS` entry of the IPv4 address `ip` behind the plugin's back (bpftool),
    /// as a node whose state was damaged would have it.
    pub fn remove_endpoint(&self, ip: std::net::Ipv4Addr) {
        let pin = self.map_pin(ebpf_common::names::ENDPOINTS);
        let octets: Vec<String> = ip.octets().iter().map(u8::to_string).collect();
        let mut args = vec!["map", "delete", "pinned", pin.to_str().expect("pin path"), "key", "4", "0", "0", "0"];
        args.extend(octets.iter().map(String::as_str));
        args.extend(["0"; 12]);
        run("bpftool", &args).expect("deleting an ENDPOINTS entry");
    }

    /// The `HOST_VETHS` slots in use, as (ifindex, IPv4 address, flags).
    pub fn host_veth_slots(&self) -> Vec<(u64, [u8; 4], u64)> {
        let dump = self.map_dump_if_pinned(ebpf_common::names::HOST_VETHS).expect("dumping HOST_VETHS");
        dump.as_array()
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let value = entry.get("formatted").map_or(&entry["value"], |f| &f["value"]);
                let ifindex = value["ifindex"].as_u64().filter(|&i| i != 0)?;
                let octets: Vec<u8> =
                    value["ipv4"].as_array()?.iter().map(|b| b.as_u64().unwrap_or_default() as u8).collect();
                Some((ifindex, octets.try_into().ok()?, value["flags"].as_u64()?))
            })
            .collect()
    }

    /// The id of the pinned `from_pod` program (the same id means it was not loaded again).
    pub fn program_id(&self) -> Result<u64> {
        let pin = self.version_dir().join("progs/from_pod");
        let out = run("bpftool", &["-j", "prog", "show", "pinned", pin.to_str().context("path")?])?;
        let info: Value = serde_json::from_slice(&out.stdout)?;
        info["id"].as_u64().context("program id")
    }

    /// Packets counted for a drop reason (summed over CPUs) from the pinned METRICS map.
    pub fn drops(&self, reason: ebpf_common::DropReason) -> Result<u64> {
        self.per_cpu_packets("METRICS", reason as u64)
    }

    /// Every drop reason counted so far, as (reason number, packets summed over CPUs).
    pub fn all_drops(&self) -> Result<Vec<(u64, u64)>> {
        let dump = self.map_dump_if_pinned("METRICS")?;
        let mut counted = Vec::new();
        for entry in dump.as_array().context("METRICS dump is not a list")? {
            let entry = entry.get("formatted").unwrap_or(entry);
            let packets: u64 = entry["values"]
                .as_array()
                .context("per-CPU values")?
                .iter()
                .filter_map(|cpu| cpu["value"]["packets"].as_u64())
                .sum();
            if packets > 0 {
                counted.push((entry["key"].as_u64().context("METRICS key")?, packets));
            }
        }
        Ok(counted)
    }

    /// Packets the programs let through on `path` (summed over CPUs), from FORWARDED.
    pub fn forwarded(&self, path: ebpf_common::ForwardPath) -> Result<u64> {
        self.per_cpu_packets("FORWARDED", path as u64)
    }

    /// Socket LB and Service events counted (summed over CPUs), from SVC_COUNTERS.
    pub fn service_events(&self, event: ebpf_common::ServiceEvent) -> Result<u64> {
        self.per_cpu_packets("SVC_COUNTERS", event as u64)
    }

    /// `packets` of slot `index` of a pinned per-CPU array of counters, summed over CPUs.
    fn per_cpu_packets(&self, map: &str, index: u64) -> Result<u64> {
        let dump = self.map_dump(map)?;
        let entries = dump.as_array().with_context(|| format!("{map} dump is not a list"))?;
        let mut total = 0;
        for entry in entries {
            let entry = entry.get("formatted").unwrap_or(entry);
            if entry["key"].as_u64() != Some(index) {
                continue;
            }
            for cpu in entry["values"].as_array().context("per-CPU values")? {
                total += cpu["value"]["packets"].as_u64().context("BTF field `packets` missing")?;
            }
        }
        Ok(total)
    }
}
