//! DEL: remove everything of one attachment. Idempotent: a second DEL, a DEL for a container we
//! never saw and a DEL whose netns is already gone all succeed. Also the rollback of a failed ADD.
use crate::{
    attachment::Attachment,
    bpf::Datapath,
    cni::{CniError, CniResult, Context, ErrorCode, config::NetConf, env::CniEnv},
    fault,
    ipam::Ipam,
    net::{local_link, netlink::Netlink},
};

pub async fn del(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<()> {
    let ipam = Ipam::from_conf(conf, raw_conf)?;
    let node = Netlink::connect().cni(ErrorCode::IO, "cannot open netlink")?;
    teardown(env, conf, &ipam, &node, true).await
}

/// The veth first: deleting it removes its tc filters and the host route with it. A packet
/// steered to the vanished veth in between is dropped and counted (redirect-failed). Then the
/// egress limit's IFB (nothing feeds it once the veth is gone), the endpoint and its flow count
/// (its NAT and FLOWS entries age, ignored by the programs), the network's pins after its last
/// pod, then the addresses.
/// Keeps going past a failed step; reports the first. `datapath` false (an ADD's rollback
/// before it reached the datapath) leaves the network's datapath as it is.
pub async fn teardown(env: &CniEnv, conf: &NetConf, ipam: &Ipam, node: &Netlink, datapath: bool) -> CniResult<()> {
    let attachment = Attachment::new(&env.container_id, &env.ifname);
    // Its `HOST_VETHS` slot is found by the veth's ifindex, which goes with the veth.
    let host_ifindex = local_link::by_name(&attachment.host_ifname()).ok().flatten().map(|link| link.index);
    // No scan of the flow maps when the programs check owners (`bpf/nat.rs`), nor of the
    // endpoints, nor of the node's routes, when IPAM recorded the attachment's addresses.
    let recorded = ipam.recorded(env).unwrap_or_else(|e| {
        log::warn!("cannot read the attachment's recorded addresses ({e}): looking through every endpoint");
        None
    });
    if let (Some(index), Some(ips)) = (host_ifindex, &recorded) {
        remove_host_routes(node, index, ips).await;
    }
    let mut first_err =
        node.delete_link(&attachment.host_ifname()).await.cni(ErrorCode::IO, "cannot delete host veth").err();
    fault::point("del:after-veth");
    if let Err(e) = node.delete_link(&attachment.ifb_name()).await {
        first_err.get_or_insert(CniError::new(ErrorCode::IO, "cannot delete the egress limit's IFB").with_details(e));
    }
    let root = conf.bpffs_root();
    if datapath && root.exists() {
        let owner = attachment.cookie();
        match Datapath::lock(&root, &conf.name) {
            Ok(dp) => {
                // Each step whatever the one before did: a failed one must not leave the rest.
                let slot = host_ifindex.map_or(Ok(()), |ifindex| dp.release_host_veth(ifindex, owner));
                let removed =
                    [slot.map(|()| 0), dp.remove_endpoints(owner, recorded.as_deref()), dp.forget_flows(owner)];
                for result in removed {
                    if let Err(e) = result {
                        first_err.get_or_insert(e);
                    }
                }
                if let Err(e) = dp.remove_if_unused(node).await {
                    first_err.get_or_insert(e);
                }
            }
            Err(e) => drop(first_err.get_or_insert(e)),
        }
    }
    fault::point("del:after-datapath");
    if let Err(e) = ipam.release(env) {
        first_err.get_or_insert(e);
    }
    // No pins of the network left: its last attachment is gone (or it never had one), and
    // IPAM's spare files go too, so that a node without pods keeps nothing of it.
    if !crate::bpf::Pins::current(&root, &conf.name).network_dir().exists()
        && let Err(e) = ipam.drop_spares()
    {
        first_err.get_or_insert(e);
    }
    first_err.map_or(Ok(()), Err)
}

/// Removes the host routes of the attachment's addresses (`ips`, as IPAM recorded them) before
/// its veth goes. A veth deleted with a route through it makes the kernel walk the node's whole
/// routing table to flush the dead route (`fib_flush`: a /32 per pod); with no route left
/// through it there is nothing to flush. Meanwhile, for the microseconds until the veth is
/// gone, the node's own packets to those addresses follow its other routes; the pod's traffic
/// does not depend on these routes (the datapath delivers it). A route that fails to go here
/// still goes with the veth.
async fn remove_host_routes(node: &Netlink, index: u32, ips: &[std::net::IpAddr]) {
    for ip in ips {
        let host = ipnetwork::IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }).expect("host prefix");
        if let Err(e) = node.delete_route(host, None, index).await {
            log::debug!("host route {host} stays until its veth goes: {e:#}");
        }
    }
}
