//! The node's interfaces and the BPF programs on them: tc (cls_bpf) filters, read over
//! netlink, and TCX links, read with BPF_PROG_QUERY (which Debian's bpftool 7.1 cannot list).
use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::programs::{ProgramInfo, SchedClassifier, TcAttachType, loaded_programs};
use ebpf_common::names;
use serde::Serialize;

use super::table::Row;
use crate::{
    attachment::{alias_limits, parse_alias},
    bpf::Pins,
    cni::bandwidth::Bandwidth,
    net::netlink::Netlink,
};

/// Where on an interface a program runs.
const HOOKS: [(&str, bool, bool); 4] = [
    ("tc ingress", true, false),
    ("tc egress", false, false),
    ("tcx ingress", true, true),
    ("tcx egress", false, true),
];

struct Interface {
    name: String,
    /// The attachment a host veth serves, from the alias ADD gave it: (container ID, ifname).
    attachment: Option<(String, String)>,
    /// The pod's bandwidth limits, as the alias records them.
    limits: Bandwidth,
    /// (hook, program id) in run order per hook.
    programs: Vec<(&'static str, u32)>,
}

/// What the node's network namespace holds, read in it once.
pub struct Interfaces {
    by_index: BTreeMap<u32, Interface>,
}

impl Interfaces {
    pub fn read() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        runtime.block_on(async {
            let netlink = Netlink::connect()?;
            let mut by_index = BTreeMap::new();
            for (index, name, alias) in netlink.links().await? {
                let attachment = alias
                    .as_deref()
                    .and_then(parse_alias)
                    .and_then(|(_, pair)| pair)
                    .map(|(id, ifname)| (id.to_string(), ifname.to_string()));
                let mut programs = Vec::new();
                for (hook, ingress, tcx) in HOOKS {
                    let ids = if tcx {
                        tcx_programs(&name, ingress)
                    } else {
                        netlink.bpf_filter_programs(index, ingress).await?
                    };
                    programs.extend(ids.into_iter().map(|id| (hook, id)));
                }
                let limits = alias.as_deref().map(alias_limits).unwrap_or_default();
                by_index.insert(index, Interface { name, attachment, limits, programs });
            }
            Ok(Self { by_index })
        })
    }

    /// The interface's name, or `?` if the index is not in the namespace (a stale entry, or
    /// `--netns` not pointing at the node).
    pub fn name(&self, index: u32) -> String {
        self.by_index.get(&index).map_or_else(|| "?".into(), |i| i.name.clone())
    }

    /// (container ID, ifname) of the pod behind a host veth, if its alias records them.
    pub fn attachment(&self, index: u32) -> Option<(String, String)> {
        self.by_index.get(&index).and_then(|i| i.attachment.clone())
    }

    /// The bandwidth limits of the pod behind a host veth (none if unknown).
    pub fn limits(&self, index: u32) -> Bandwidth {
        self.by_index.get(&index).map(|i| i.limits).unwrap_or_default()
    }
}

/// TCX programs of one side; none when the kernel or interface has no TCX chain.
fn tcx_programs(ifname: &str, ingress: bool) -> Vec<u32> {
    let side = if ingress { TcAttachType::Ingress } else { TcAttachType::Egress };
    SchedClassifier::query_tcx(ifname, side)
        .map(|(_, infos)| infos.iter().map(ProgramInfo::id).collect())
        .unwrap_or_default()
}

#[derive(Serialize)]
pub struct ProgramRow {
    interface: String,
    ifindex: u32,
    hook: &'static str,
    program_id: u32,
    program_name: String,
    /// The name of this network's pinned program it is, if it is one.
    ours: Option<&'static str>,
}

impl Row for ProgramRow {
    const HEADERS: &'static [&'static str] = &["INTERFACE", "IFINDEX", "HOOK", "PROG ID", "PROG NAME", "OURS"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.interface.clone(),
            self.ifindex.to_string(),
            self.hook.into(),
            self.program_id.to_string(),
            self.program_name.clone(),
            self.ours.map_or_else(|| "-".into(), |p| format!("yes ({p})")),
        ]
    }
}

pub fn rows(pins: &Pins, interfaces: &Interfaces) -> Result<Vec<ProgramRow>> {
    let mut pinned = BTreeMap::new();
    for name in [
        names::FROM_POD,
        names::TO_POD,
        names::TO_UPLINK,
        names::FROM_UPLINK,
        names::TO_UPLINK6,
        names::FROM_UPLINK6,
        names::SVC_FROM_UPLINK,
        names::SVC_TO_UPLINK,
        names::SVC_FROM_UPLINK6,
        names::SVC_TO_UPLINK6,
    ] {
        // A network loads only the programs it attaches (no uplink ones without masquerade,
        // no IPv6 uplink ones without IPv6).
        let pin = pins.program(name);
        if !pin.exists() {
            continue;
        }
        let info = ProgramInfo::from_pin(&pin).with_context(|| format!("opening pinned {name}"))?;
        pinned.insert(info.id(), name);
    }
    let loaded: BTreeMap<u32, String> = loaded_programs()
        .filter_map(Result::ok)
        .map(|p| (p.id(), p.name_as_str().unwrap_or_default().to_string()))
        .collect();
    let mut rows = Vec::new();
    for (&ifindex, interface) in &interfaces.by_index {
        for &(hook, id) in &interface.programs {
            rows.push(ProgramRow {
                interface: interface.name.clone(),
                ifindex,
                hook,
                program_id: id,
                program_name: loaded.get(&id).cloned().unwrap_or_default(),
                ours: pinned.get(&id).copied(),
            });
        }
    }
    Ok(rows)
}
