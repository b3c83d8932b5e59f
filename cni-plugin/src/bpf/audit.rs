//! CHECK and GC on the kernel side: is an attachment's datapath as ADD left it, and what of
//! the network belongs to no attachment still in use.
use std::{collections::BTreeSet, net::IpAddr};

use aya::programs::SchedClassifier;
use ebpf_common::names;

use super::datapath::Datapath;
use crate::{
    cni::{CniError, CniResult, Context, ErrorCode},
    net::netlink::Netlink,
};

/// What CHECK expects of one attachment.
pub struct Expected<'a> {
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub owner: u64,
    pub ips: &'a [IpAddr],
    /// Ids of the programs the host veth's ingress filters run (read over netlink).
    pub ingress_programs: &'a [u32],
    /// Whether the pod has an ingress limit (`ENDPOINT_SHAPED` on its entries).
    pub shaped: bool,
    /// Whether the pod has an egress limit (`ENDPOINT_EGRESS_SHAPED` on its entries).
    pub egress_shaped: bool,
}

/// What GC removed from the kernel.
#[derive(Debug, Default)]
pub struct Collected {
    pub endpoints: usize,
    pub nat_entries: usize,
    pub flow_entries: usize,
    pub network_removed: bool,
}

impl Datapath {
    /// The program is pinned, a filter on the host veth's ingress runs it, and every address
    /// has its endpoint entry pointing at that veth.
    pub fn check(&self, want: &Expected<'_>) -> CniResult<()> {
        if !self.is_loaded() {
            return Err(wrong("the network's programs are not loaded (no from_pod pin)"));
        }
        let program = SchedClassifier::from_pin(self.pins.program(names::FROM_POD))
            .cni(ErrorCode::DATAPATH, "cannot open pinned from_pod")?;
        let program_id = program.info().cni(ErrorCode::DATAPATH, "cannot read from_pod's info")?.id();
        if !want.ingress_programs.contains(&program_id) {
            return Err(wrong(format!(
                "no filter on {}'s ingress runs from_pod (program {program_id}; found {:?})",
                want.host_ifname, want.ingress_programs
            )));
        }
        let map = self.endpoints()?.ok_or_else(|| wrong("ENDPOINTS is not pinned"))?;
        for ip in want.ips {
            let entry =
                map.get(&super::datapath::ip_key(*ip), 0).map_err(|_| wrong(format!("no endpoint entry for {ip}")))?;
            if entry.owner != want.owner || entry.host_ifindex != want.host_ifindex {
                return Err(wrong(format!(
                    "endpoint {ip} belongs to another attachment (owner {:#x}, ifindex {})",
                    entry.owner, entry.host_ifindex
                )));
            }
            if (entry.flags & ebpf_common::ENDPOINT_SHAPED != 0) != want.shaped {
                let (is, asked) = if want.shaped { ("is not", "has") } else { ("is", "has no") };
                return Err(wrong(format!(
                    "endpoint {ip} {is} marked for shaped delivery; the pod {asked} an ingress limit"
                )));
            }
            if (entry.flags & ebpf_common::ENDPOINT_EGRESS_SHAPED != 0) != want.egress_shaped {
                let (is, asked) = if want.egress_shaped { ("is not", "has") } else { ("is", "has no") };
                return Err(wrong(format!(
                    "endpoint {ip} {is} marked to send through an IFB; the pod {asked} an egress limit"
                )));
            }
        }
        Ok(())
    }

    /// Removes endpoints, NAT and FLOWS entries of attachments whose owner cookie is not in `valid`,
    /// then the network's pins if nothing is left. Keeps going past a failed step and reports
    /// the first failure.
    pub async fn collect_garbage(&self, valid_owners: &BTreeSet<u64>, node: &Netlink) -> CniResult<Collected> {
        let mut done = Collected::default();
        let mut first_err: Option<CniError> = None;
        let mut note = |r: CniResult<usize>, count: &mut usize| match r {
            Ok(n) => *count += n,
            Err(e) => drop(first_err.get_or_insert(e)),
        };
        note(self.remove_endpoints_where(|o| !valid_owners.contains(&o)), &mut done.endpoints);
        // Slots whose endpoints are gone without them (an ADD that failed between the two).
        let mut slots = 0;
        note(self.clear_host_veths_where(|o| !valid_owners.contains(&o)), &mut slots);
        // Programs that check owners ignore the flows of gone owners: GC sweeps those after it
        // lets the lock go (`nat::sweep_flows`), not while every ADD of the node waits.
        if self.checks_owners() {
            let counted = self.remove_pod_flows_where(|o| !valid_owners.contains(&o));
            note(counted.map(|()| 0), &mut done.nat_entries);
        } else {
            note(self.remove_nat_where(|o| !valid_owners.contains(&o)), &mut done.nat_entries);
            note(self.remove_flows_where(|o| !valid_owners.contains(&o)), &mut done.flow_entries);
        }
        match self.remove_if_unused(node).await {
            Ok(removed) => done.network_removed = removed,
            Err(e) => drop(first_err.get_or_insert(e)),
        }
        first_err.map_or(Ok(done), Err)
    }
}

/// CHECK found the datapath differs from what ADD made.
fn wrong(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::CHECK_FAILED, msg)
}
