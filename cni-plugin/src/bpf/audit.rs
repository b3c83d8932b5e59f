//! CHECK and GC on the kernel side: is an attachment's datapath as ADD left it, and what of
//! the network belongs to no attachment still in use.
use std::{collections::BTreeSet, fs, net::Ipv4Addr};

use aya::programs::{
    SchedClassifier, TcAttachType,
    links::{FdLink, PinnedLink},
};
use ebpf_common::{IpKey, names};

use super::datapath::Datapath;
use crate::cni::{CniError, CniResult, Context, ErrorCode};

/// What CHECK expects of one attachment.
pub struct Expected<'a> {
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub owner: u64,
    pub ips: &'a [Ipv4Addr],
}

/// What GC removed from the kernel.
#[derive(Debug, Default)]
pub struct Collected {
    pub links: usize,
    pub endpoints: usize,
    pub nat_entries: usize,
    pub network_removed: bool,
}

impl Datapath {
    /// The program is pinned, the attachment's link pin holds it, TCX runs it on the host
    /// veth's ingress, and every address has its endpoint entry pointing at that veth.
    pub fn check(&self, want: &Expected<'_>) -> CniResult<()> {
        if !self.is_loaded() {
            return Err(wrong("the network's programs are not loaded (no from_pod pin)"));
        }
        let program = SchedClassifier::from_pin(self.pins.program(names::FROM_POD))
            .cni(ErrorCode::DATAPATH, "cannot open pinned from_pod")?;
        let program_id = program.info().cni(ErrorCode::DATAPATH, "cannot read from_pod's info")?.id();
        let link_pin = self.pins.link(want.container_id, want.ifname);
        let link: FdLink = PinnedLink::from_pin(&link_pin)
            .map_err(|e| wrong(format!("TCX link pin {} is missing", link_pin.display())).with_details(e))?
            .into();
        let linked = link.info().cni(ErrorCode::DATAPATH, "cannot read the link's info")?.program_id();
        if linked != program_id {
            return Err(wrong(format!("the pinned link runs program {linked}, not from_pod ({program_id})")));
        }
        let (_, attached) = SchedClassifier::query_tcx(want.host_ifname, TcAttachType::Ingress)
            .cni(ErrorCode::DATAPATH, format!("cannot query TCX on {}", want.host_ifname))?;
        if !attached.iter().any(|p| p.id() == program_id) {
            return Err(wrong(format!("from_pod is not attached to {}'s TCX ingress", want.host_ifname)));
        }
        let map = self.endpoints()?.ok_or_else(|| wrong("ENDPOINTS is not pinned"))?;
        for ip in want.ips {
            let entry =
                map.get(&IpKey::v4(ip.octets()), 0).map_err(|_| wrong(format!("no endpoint entry for {ip}")))?;
            if entry.owner != want.owner || entry.host_ifindex != want.host_ifindex {
                return Err(wrong(format!(
                    "endpoint {ip} belongs to another attachment (owner {:#x}, ifindex {})",
                    entry.owner, entry.host_ifindex
                )));
            }
        }
        Ok(())
    }

    /// Removes link pins, endpoints and NAT entries of attachments not in `valid` (pin names
    /// and owner cookies), then the network's pins if nothing is left. Keeps going past a
    /// failed step and reports the first failure.
    pub fn collect_garbage(
        &self,
        valid_links: &BTreeSet<String>,
        valid_owners: &BTreeSet<u64>,
    ) -> CniResult<Collected> {
        let mut done = Collected::default();
        let mut first_err: Option<CniError> = None;
        let mut note = |r: CniResult<usize>, count: &mut usize| match r {
            Ok(n) => *count += n,
            Err(e) => drop(first_err.get_or_insert(e)),
        };
        note(self.remove_links_except(valid_links), &mut done.links);
        note(self.remove_endpoints_where(|o| !valid_owners.contains(&o)), &mut done.endpoints);
        note(self.remove_nat_where(|o| !valid_owners.contains(&o)), &mut done.nat_entries);
        match self.remove_if_unused() {
            Ok(removed) => done.network_removed = removed,
            Err(e) => drop(first_err.get_or_insert(e)),
        }
        first_err.map_or(Ok(done), Err)
    }

    fn remove_links_except(&self, valid: &BTreeSet<String>) -> CniResult<usize> {
        let Ok(dir) = fs::read_dir(self.pins.links_dir()) else { return Ok(0) };
        let mut removed = 0;
        for entry in dir.filter_map(Result::ok) {
            if entry.file_name().to_str().is_some_and(|name| valid.contains(name)) {
                continue;
            }
            fs::remove_file(entry.path())
                .cni(ErrorCode::DATAPATH, format!("cannot unpin {}", entry.path().display()))?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// CHECK found the datapath differs from what ADD made.
fn wrong(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::CHECK_FAILED, msg)
}
