//! CHECK: compares the attachment with the result ADD returned (`prevResult`, possibly changed
//! by later plugins of the chain) and with what ADD put in the kernel. Read-only; the first
//! difference found is the error.
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::{
    attachment::Attachment,
    bpf::{Datapath, Expected},
    cni::{
        CniError, CniResult, Context, ErrorCode,
        bandwidth::Limit,
        config::NetConf,
        env::CniEnv,
        request::Request,
        result::{AddResult, Interface},
    },
    ipam::Ipam,
    net::{
        netlink::{BpfFilter, Link, Netlink, RouteEntry, format_mac},
        netns::Netns,
        qdisc::same_limit,
    },
};

pub async fn check(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<()> {
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(ErrorCode::INVALID_CONFIG, "CHECK needs prevResult (the cached result of ADD)"))?;
    let result = AddResult::from_json(prev)?;
    let attachment = Attachment::new(&env.container_id, &env.ifname);
    let host_ifname = attachment.host_ifname();
    let (pod_index, pod_iface) = result
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == env.ifname && i.sandbox.is_some())
        .ok_or_else(|| differs(format!("prevResult has no interface {} inside a sandbox", env.ifname)))?;
    let netns_path = env.netns.as_deref().expect("validated: CHECK has CNI_NETNS");
    let pod_ns = Netns::open(netns_path).map_err(|e| {
        CniError::new(ErrorCode::UNKNOWN_CONTAINER, format!("cannot use CNI_NETNS {}", netns_path.display()))
            .with_details(e)
    })?;
    let node = Netlink::connect().cni(ErrorCode::IO, "cannot open netlink")?;
    let pod = Netlink::connect_in(&pod_ns).cni(ErrorCode::IO, "cannot open netlink in the pod")?;

    let pod_link = expect_link(&pod, &env.ifname, Some(pod_iface), "pod").await?;
    let host_iface = result.interfaces.iter().find(|i| i.name == host_ifname && i.sandbox.is_none());
    let host_link = expect_link(&node, &host_ifname, host_iface, "node").await?;

    // The addresses of our interface (an IP without `interface` is taken as ours).
    let ips: Vec<&IpNetwork> =
        result.ips.iter().filter(|ip| ip.interface.is_none_or(|i| i == pod_index)).map(|ip| &ip.address).collect();
    let present = pod.addresses(pod_link.index).await.cni(ErrorCode::IO, "cannot list the pod's addresses")?;
    for ip in &ips {
        if !present.contains(ip) {
            return Err(differs(format!("{} has no address {ip}", env.ifname)));
        }
    }
    let pod_routes = pod.routes_via(pod_link.index).await.cni(ErrorCode::IO, "cannot list the pod's routes")?;
    for route in &result.routes {
        if !pod_routes.iter().any(|r| r.dst == route.dst && (route.gw.is_none() || r.gw == route.gw)) {
            let via = route.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(differs(format!("the pod has no route {}{via} on {}", route.dst, env.ifname)));
        }
    }
    let addresses: Vec<IpAddr> = ips.iter().map(|ip| ip.ip()).collect();
    let host_routes = node.routes_via(host_link.index).await.cni(ErrorCode::IO, "cannot list the node's routes")?;
    for ip in &addresses {
        let dst = IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }).expect("host prefix");
        if !host_routes.contains(&RouteEntry { dst, gw: None }) {
            return Err(differs(format!("the node has no route {dst} dev {host_ifname}")));
        }
    }
    let bandwidth = Request::gather(&env.args, conf)?.bandwidth;
    expect_limit(&node, host_link.index, bandwidth.ingress, &format!("{host_ifname} (ingress)")).await?;
    let ingress_filters =
        node.bpf_filters(host_link.index, true).await.cni(ErrorCode::IO, "cannot list the host veth's filters")?;
    if let Some(egress) = bandwidth.egress {
        expect_egress_limit(&node, &host_link, &host_ifname, &attachment.ifb_name(), egress, &ingress_filters).await?;
    }
    let ingress_programs: Vec<u32> = ingress_filters.iter().map(|f| f.program_id).collect();
    let datapath = Datapath::lock(&conf.bpffs_root(), &conf.name)?;
    datapath.check(&Expected {
        host_ifname: &host_ifname,
        host_ifindex: host_link.index,
        owner: attachment.cookie(),
        ips: &addresses,
        ingress_programs: &ingress_programs,
        shaped: bandwidth.ingress.is_some(),
        egress_shaped: bandwidth.egress.is_some(),
    })?;
    drop(datapath);
    // IPAM holds every address of the result, of either family.
    Ipam::from_conf(conf, raw_conf)?.check(env, &addresses)
}

/// The link exists and, when the result names its MAC, has that MAC.
async fn expect_link(nl: &Netlink, name: &str, iface: Option<&Interface>, place: &str) -> CniResult<Link> {
    let link = nl
        .link(name)
        .await
        .cni(ErrorCode::IO, "cannot list links")?
        .ok_or_else(|| differs(format!("interface {name} is missing in the {place}")))?;
    let want = iface.map(|i| i.mac.to_ascii_lowercase()).filter(|m| !m.is_empty());
    if let Some(want) = want.filter(|w| *w != format_mac(link.mac)) {
        return Err(differs(format!("{name} in the {place} has MAC {}, the result says {want}", format_mac(link.mac))));
    }
    Ok(link)
}

/// A limit asked for is a TBF root qdisc of that rate and burst on `index`. Without one, nothing
/// is checked: a root qdisc there is somebody else's.
async fn expect_limit(nl: &Netlink, index: u32, asked: Option<Limit>, place: &str) -> CniResult<()> {
    let Some(asked) = asked else { return Ok(()) };
    match nl.root_tbf(index).await.cni(ErrorCode::IO, "cannot list qdiscs")? {
        Some(found) if same_limit(asked, found) => Ok(()),
        Some(found) => Err(differs(format!(
            "{place} is limited to {} bit/s (burst {} bits), not {} bit/s (burst {} bits)",
            found.rate, found.burst, asked.rate, asked.burst
        ))),
        None => Err(differs(format!("{place} has no bandwidth limit ({} bit/s asked)", asked.rate))),
    }
}

/// An egress limit asked for is the TBF root qdisc of the pod's IFB, that IFB up, and a filter
/// on the host veth's ingress redirecting to it that runs after the BPF filters (`from_pod`
/// hands the pod's packets on to it).
async fn expect_egress_limit(
    node: &Netlink,
    host: &Link,
    host_ifname: &str,
    ifb_name: &str,
    asked: Limit,
    bpf_filters: &[BpfFilter],
) -> CniResult<()> {
    let Some(ifb) = node.link(ifb_name).await.cni(ErrorCode::IO, "cannot list links")? else {
        return Err(differs(format!(
            "the pod's egress has no bandwidth limit ({} bit/s asked): its IFB {ifb_name} is missing",
            asked.rate
        )));
    };
    expect_limit(node, ifb.index, Some(asked), &format!("{ifb_name} (the pod's egress)")).await?;
    if !node.is_up(ifb.index).await.cni(ErrorCode::IO, "cannot look up the IFB")? {
        return Err(differs(format!("{ifb_name} (the pod's egress) is down: it drops what the pod sends")));
    }
    let redirects =
        node.ingress_redirects(host.index).await.cni(ErrorCode::IO, "cannot list the host veth's filters")?;
    let last_bpf = bpf_filters.iter().map(|f| f.priority).max().unwrap_or(0);
    match redirects.iter().find(|r| r.target == ifb.index) {
        Some(r) if r.priority > last_bpf => Ok(()),
        Some(r) => Err(differs(format!(
            "the filter sending {host_ifname}'s packets to {ifb_name} runs before from_pod (priority {} ≤ {last_bpf})",
            r.priority
        ))),
        None => Err(differs(format!("no filter on {host_ifname}'s ingress sends the pod's packets to {ifb_name}"))),
    }
}

fn differs(msg: String) -> CniError {
    CniError::new(ErrorCode::CHECK_FAILED, msg)
}
