//! GC (spec 1.1): everything of this network that belongs to no attachment in
//! `cni.dev/valid-attachments` goes: host veths (and with them the pod ends and /32 routes) and
//! the IFBs of egress limits, endpoint and NAT entries, IP reservations, and the network's
//! programs and maps once no endpoint is left. Keeps going past a failed step; reports the first failure.
use std::collections::BTreeSet;

use crate::{
    attachment::{self, ALIAS_PREFIX, Attachment},
    bpf::{self, Datapath, Pins},
    cni::{CniError, CniResult, Context, ErrorCode, config::NetConf, env::CniEnv},
    ipam::{Holder, Ipam},
    net::netlink::Netlink,
};

pub async fn gc(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<()> {
    let valid = conf.gc_attachments();
    let is_valid = |id: &str, ifname: &str| valid.iter().any(|a| a.container_id == id && a.ifname == ifname);
    let keep = |h: &Holder| valid.iter().any(|a| h.is(&a.container_id, &a.ifname));
    let ipam = Ipam::from_conf(conf, raw_conf)?;
    let node = Netlink::connect().cni(ErrorCode::IO, "cannot open netlink")?;
    let mut first_err: Option<CniError> = None;

    // Veths first, as in DEL: an address is released only once nothing routes to it.
    let mut doomed: BTreeSet<String> = BTreeSet::new();
    // Host veths and the IFBs of egress limits, which carry their veth's alias.
    let valid_host_ifnames: BTreeSet<String> = valid
        .iter()
        .map(|a| Attachment::new(&a.container_id, &a.ifname))
        .flat_map(|a| [a.host_ifname(), a.ifb_name()])
        .collect();
    match node.links_by_alias(ALIAS_PREFIX).await {
        Ok(links) => {
            for (name, alias) in links {
                let Some((network, pair)) = attachment::parse_alias(&alias) else { continue };
                let stale = match pair {
                    Some((id, ifname)) => !is_valid(id, ifname),
                    None => !valid_host_ifnames.contains(&name),
                };
                if network == conf.name && stale {
                    doomed.insert(name);
                }
            }
        }
        Err(e) => drop(first_err.get_or_insert(CniError::new(ErrorCode::IO, "cannot list links").with_details(e))),
    }
    // An ADD killed between creating the veth (or IFB) and labelling it left an unlabelled one;
    // its address reservation still names it.
    let holders = ipam.holders().unwrap_or_else(|e| {
        first_err.get_or_insert(e);
        Vec::new()
    });
    for holder in holders.iter().filter(|h| !keep(h)) {
        let Some(ifname) = &holder.ifname else { continue };
        let attachment = Attachment::new(&holder.container_id, ifname);
        for name in [attachment.host_ifname(), attachment.ifb_name()] {
            if node.link(&name).await.is_ok_and(|l| l.is_some()) {
                doomed.insert(name);
            }
        }
    }
    for name in &doomed {
        if let Err(e) = node.delete_link(name).await {
            first_err.get_or_insert(CniError::new(ErrorCode::IO, format!("cannot delete {name}")).with_details(e));
        }
    }

    let root = conf.bpffs_root();
    let mut collected = None;
    if root.exists() {
        let owners: BTreeSet<u64> =
            valid.iter().map(|a| Attachment::new(&a.container_id, &a.ifname).cookie()).collect();
        let collect = async { Datapath::lock(&root, &conf.name)?.collect_garbage(&owners, &node).await };
        match collect.await {
            Ok(done) => collected = Some(done),
            Err(e) => drop(first_err.get_or_insert(e)),
        }
        // The lock is gone: the sweep of the flow maps holds up no ADD.
        let pins = Pins::current(&root, &conf.name);
        if let Err(e) = bpf::recount_shares(&pins) {
            first_err.get_or_insert(e);
        }
        match bpf::sweep_flows(&pins) {
            Ok((nat, flows)) => {
                if let Some(done) = collected.as_mut() {
                    done.nat_entries += nat;
                    done.flow_entries += flows;
                }
            }
            Err(e) => drop(first_err.get_or_insert(e)),
        }
        // After the sweep: a gone pod's flows renew nothing.
        if let Err(e) = bpf::renew_stack_epochs(&root, &conf.name) {
            first_err.get_or_insert(e);
        }
    }
    let released = match ipam.collect_garbage(env, keep) {
        Ok(stale) => stale.len(),
        Err(e) => {
            first_err.get_or_insert(e);
            0
        }
    };
    let kernel = collected.unwrap_or_default();
    log::info!(
        "GC of {} kept {} attachments; removed {} veths and IFBs, {} endpoints, {} NAT entries, {} FLOWS \
         entries, {released} IP reservations{}",
        conf.name,
        valid.len(),
        doomed.len(),
        kernel.endpoints,
        kernel.nat_entries,
        kernel.flow_entries,
        if kernel.network_removed { ", and the network's programs and maps" } else { "" }
    );
    first_err.map_or(Ok(()), Err)
}
