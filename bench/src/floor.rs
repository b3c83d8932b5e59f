//! The floor of the pod → pod path: ebpf-cni's pods, and in front of `from_pod` on each host
//! veth the object's `floor` program (`ebpf/src/floor.rs`), which only writes the MACs and
//! redirects into the other pod with `bpf_redirect_peer`, looking nothing up. What the pair
//! measures above the bare veth pair is the host veth's hop itself; what ebpf-cni measures
//! above the floor is `from_pod`'s own work. The plugin never loads the program: the bench
//! takes the object out of the plugin binary (where it is embedded) and loads it with aya.
use anyhow::{Context, Result, bail, ensure};
use aya::{
    EbpfLoader,
    programs::{
        SchedClassifier, TcAttachType,
        tc::{NlOptions, TcAttachOptions},
    },
};
use ebpf_cni_tests::{Plugin, run_in, traffic::in_netns};
use ebpf_common::{FloorTarget, names};
use serde_json::Value;

use crate::topology::Pair;

/// `EM_BPF` in an ELF header's `e_machine`.
const EM_BPF: u16 = 247;

/// Puts the floor program on both host veths of `pair` (ebpf-cni pods), each redirecting into
/// the other pod. The filters stay until the veths go with the pair.
pub fn attach(pair: &Pair, ours: &Plugin) -> Result<()> {
    let node = &pair.node().context("the floor needs ebpf-cni pods")?.node.name;
    // A build before the floor has none in its object: `EBPF_CNI_FLOOR_FROM` names the binary
    // to take it from, so a release can be measured against the same floor as this build.
    let source = std::env::var_os("EBPF_CNI_FLOOR_FROM").map_or_else(|| ours.binary.clone(), Into::into);
    let object = object(&std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?)?;
    let client = Side::of(node, &pair.client_ns)?;
    let server = Side::of(node, &pair.server_ns)?;
    for (from, to) in [(&client, &server), (&server, &client)] {
        let target = FloorTarget { ifindex: to.host_ifindex, dst_mac: to.pod_mac, src_mac: to.host_mac };
        let (object, ifname) = (object.clone(), from.host_ifname.clone());
        in_netns(node, move || load_and_attach(&object, target, &ifname))?;
    }
    Ok(())
}

fn load_and_attach(object: &[u8], target: FloorTarget, ifname: &str) -> Result<()> {
    let mut loader = EbpfLoader::new();
    // Every map of the object is created with it: the large ones as small as they go.
    for map in [
        names::NAT,
        names::FRAGMENTS,
        names::NODE_ECHOES,
        names::FLOWS,
        names::NAT_SHARES,
        names::ENDPOINTS,
        names::POD_FLOWS,
        names::SVC_CT,
        names::SVC_CLIENTS,
        names::SVC_AFFINITY,
        names::SVC_SOCKETS,
        names::SVC_FRONTENDS,
        names::SVC_BACKENDS,
    ] {
        loader.map_max_entries(map, 16);
    }
    let mut ebpf = loader.override_global(names::FLOOR_TARGET, &target, true).load(object)?;
    let program: &mut SchedClassifier =
        ebpf.program_mut(names::FLOOR).context("the object has no floor program")?.try_into()?;
    program.load()?;
    // No priority: the kernel puts the filter before `from_pod`'s, which still answers ARP.
    let id =
        program.attach_with_options(ifname, TcAttachType::Ingress, TcAttachOptions::Netlink(NlOptions::default()))?;
    let link = program.take_link(id)?;
    // The filter outlives the handle (it belongs to the device), as the plugin's do.
    std::mem::forget(link);
    Ok(())
}

/// One pod as the floor needs it: its host veth and the MACs of both ends.
struct Side {
    host_ifindex: u32,
    host_ifname: String,
    host_mac: [u8; 6],
    pod_mac: [u8; 6],
}

impl Side {
    fn of(node: &str, pod_ns: &str) -> Result<Self> {
        let eth0 = link(pod_ns, Some("eth0"))?;
        let host_ifindex = eth0["link_index"].as_u64().context("eth0 has no peer index")? as u32;
        let host = link(node, None)?
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["ifindex"].as_u64() == Some(u64::from(host_ifindex)))
            .cloned()
            .with_context(|| format!("no host veth {host_ifindex} in {node}"))?;
        Ok(Self {
            host_ifindex,
            host_ifname: host["ifname"].as_str().context("no ifname")?.into(),
            host_mac: mac(&host)?,
            pod_mac: mac(&eth0)?,
        })
    }
}

/// `ip -j link show [dev]` in `netns`: one link's object, or the array of all.
fn link(netns: &str, dev: Option<&str>) -> Result<Value> {
    let mut args = vec!["-j", "link", "show"];
    args.extend(dev.iter().flat_map(|d| ["dev", *d]));
    let out = run_in(netns, "ip", &args)?;
    let all: Value = serde_json::from_slice(&out.stdout)?;
    Ok(match dev {
        Some(_) => all.get(0).cloned().context("no such link")?,
        None => all,
    })
}

fn mac(link: &Value) -> Result<[u8; 6]> {
    let text = link["address"].as_str().context("no address")?;
    let bytes: Vec<u8> = text.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("not a MAC: {text}"))
}

/// The eBPF object embedded in the plugin binary: the first 64-bit little-endian ELF inside it
/// (past its own header) whose machine is BPF, up to the end of its section headers (the last
/// thing the linker writes).
fn object(binary: &[u8]) -> Result<Vec<u8>> {
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let mut from = 1;
    while let Some(found) = binary[from..].windows(4).position(|w| w == b"\x7fELF") {
        let start = from + found;
        let header = &binary[start..];
        if header.len() >= 64 && header[4] == 2 && header[5] == 1 && u16_at(header, 18) == EM_BPF {
            let shoff = u64::from_le_bytes(header[0x28..0x30].try_into()?) as usize;
            let end = shoff + usize::from(u16_at(header, 0x3a)) * usize::from(u16_at(header, 0x3c));
            ensure!(end <= header.len(), "the embedded object runs past the binary's end");
            return Ok(header[..end].to_vec());
        }
        from = start + 1;
    }
    bail!("no eBPF object in the plugin binary")
}
