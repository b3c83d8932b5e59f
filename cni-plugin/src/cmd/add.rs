//! ADD: address, veth pair, pod addresses and routes, host route, bandwidth limits, endpoint
//! entry, tc filter.
//! Nothing is touched before the checks that can fail cheaply; after that, any failure runs the
//! same teardown as DEL, which is scoped to this attachment and so cannot hurt anyone else's.
use std::{cell::Cell, net::IpAddr};

use ebpf_common::{ENDPOINT_EGRESS_SHAPED, ENDPOINT_SHAPED, Endpoint};
use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};

use super::del::teardown;
use crate::{
    attachment::{self, Attachment},
    bpf::{Datapath, Settings},
    cni::{
        CniError, CniResult, Context, ErrorCode,
        bandwidth::Limit,
        config::NetConf,
        env::CniEnv,
        request::Request,
        result::{AddResult, Interface, IpConfig, Route},
    },
    fault,
    ipam::{Allocation, Ipam},
    net::{
        local_link,
        netlink::{Netlink, format_mac},
        netns::Netns,
        sysctl,
    },
};

pub async fn add(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<AddResult> {
    if conf.prev_result.is_some() {
        return Err(CniError::new(
            ErrorCode::INVALID_CONFIG,
            "ebpf-cni creates the pod's interface and must be the first plugin of a chain",
        )
        .with_details("this ADD carries a prevResult: move ebpf-cni to the front of the conflist's plugins"));
    }
    let request = Request::gather(&env.args, conf)?;
    let ipam = Ipam::from_conf(conf, raw_conf)?;
    // The node's primary network under a configuration that is not the node file's (another
    // subnet, as a NetworkAttachmentDefinition taking the name could write): refused here,
    // before anything is touched, so it never loads or replaces the network's datapath.
    if let Some(primary) = &conf.node_subnets {
        primary.check_ranges(ipam.range_subnets().as_deref())?;
    }
    let netns_path = env.netns.as_deref().expect("validated: ADD has CNI_NETNS");
    let pod_ns = Netns::open(netns_path).map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorCode::UNKNOWN_CONTAINER,
            _ => ErrorCode::INVALID_ENV,
        };
        CniError::new(code, format!("cannot use CNI_NETNS {}", netns_path.display())).with_details(e)
    })?;
    // The node's own namespace as the pod's would move the node's traffic into a pod interface
    // and give the node a default route through it.
    if pod_ns.is(&Netns::current().cni(ErrorCode::IO, "cannot open the plugin's own namespace")?).unwrap_or(false) {
        return Err(CniError::new(
            ErrorCode::INVALID_ENV,
            format!("CNI_NETNS {} is the node's own network namespace, not a pod's", netns_path.display()),
        )
        .with_details("the runtime must pass the pod sandbox's namespace"));
    }
    let attachment = Attachment::new(&env.container_id, &env.ifname);
    let node = Netlink::connect().cni(ErrorCode::IO, "cannot open netlink")?;
    let pod = Netlink::connect_in(&pod_ns).cni(ErrorCode::IO, "cannot open netlink in the pod")?;
    let host_ifname = attachment.host_ifname();
    for (nl, name, place) in [(&node, host_ifname.as_str(), "node"), (&pod, env.ifname.as_str(), "pod")] {
        if nl.link(name).await.cni(ErrorCode::IO, "cannot list links")?.is_some() {
            return Err(CniError::new(
                ErrorCode::INTERFACE_EXISTS,
                format!("interface {name} already exists in the {place}"),
            )
            .with_details("an attachment with this container ID and ifname is already set up; DEL it first"));
        }
    }
    let setup = Setup {
        env,
        conf,
        request: &request,
        attachment: &attachment,
        node: &node,
        pod: &pod,
        pod_ns: &pod_ns,
        datapath_reached: Cell::new(false),
    };
    match setup.run(&ipam).await {
        Ok(result) => Ok(result),
        Err(err) => {
            // An ADD refused before it reached the datapath leaves it as it was: in particular a
            // datapath loaded ahead (by the agent) with no pod yet stays loaded.
            let datapath = setup.datapath_reached.get();
            if let Err(cleanup) = teardown(env, conf, &ipam, &node, datapath).await {
                log::error!("rollback after failed ADD was incomplete: {cleanup}");
            }
            Err(err)
        }
    }
}

struct Setup<'a> {
    env: &'a CniEnv,
    conf: &'a NetConf,
    request: &'a Request,
    attachment: &'a Attachment,
    node: &'a Netlink,
    pod: &'a Netlink,
    pod_ns: &'a Netns,
    /// Whether the ADD got as far as the network's datapath (its rollback then cleans it up).
    datapath_reached: Cell<bool>,
}

impl Setup<'_> {
    async fn run(&self, ipam: &Ipam) -> CniResult<AddResult> {
        let allocation = ipam.allocate(self.env, &self.request.ips)?;
        fault::point("add:after-ipam");
        let ips: Vec<IpAddr> = allocation.ips.iter().map(|ip| ip.address.ip()).collect();
        if ips.is_empty() {
            return Err(CniError::new(ErrorCode::INVALID_CONFIG, "IPAM gave the pod no address"));
        }
        // A delegated IPAM's ranges are only known by what it hands out.
        if let Some(primary) = &self.conf.node_subnets {
            let addresses: Vec<IpNetwork> = allocation.ips.iter().map(|ip| ip.address).collect();
            primary.check_allocation(&addresses)?;
        }
        self.refuse_foreign_addresses(&ips).await?;
        let has_ipv6 = ips.iter().any(IpAddr::is_ipv6);
        let host_ifname = self.attachment.host_ifname();
        self.node
            .add_veth(&host_ifname, &self.env.ifname, self.pod_ns, self.conf.mtu, self.request.mac)
            .await
            .cni(ErrorCode::IO, "cannot create veth pair")?;
        fault::point("add:after-veth");
        // Its filters come last (`bpf::add_clsact` says why it goes first), and a qdisc added
        // while the veth is down costs no deactivation (`limit_bandwidth` below). It goes with
        // the veth.
        crate::bpf::add_clsact(&host_ifname)?;
        // By ioctl: a host veth's RTM_GETLINK answer grows with the node's pods (`local_link`).
        let host =
            local_link::by_name(&host_ifname).cni(ErrorCode::IO, "host veth")?.ok_or_else(|| gone(&host_ifname))?;
        let alias =
            attachment::alias(&self.conf.name, &self.env.container_id, &self.env.ifname, &self.request.bandwidth);
        self.node.set_alias(host.index, &alias).await.cni(ErrorCode::IO, "cannot label the host veth")?;
        let pod = self
            .pod
            .link(&self.env.ifname)
            .await
            .cni(ErrorCode::IO, "pod veth")?
            .ok_or_else(|| gone(&self.env.ifname))?;
        if has_ipv6 {
            self.ipv6_settings(&host_ifname)?;
        } else {
            no_ipv6_on_host(&host_ifname);
        }
        // Root qdisc while the veth is down: grafting one onto a running device deactivates it
        // first, which waits for an RCU grace period and for its queues to drain.
        self.limit_bandwidth(host.index).await?;
        self.node.set_up(host.index).await.cni(ErrorCode::IO, "cannot set host veth up")?;
        self.pod.set_up(pod.index).await.cni(ErrorCode::IO, "cannot set pod interface up")?;
        for ip in &allocation.ips {
            // With a gateway, the subnet is routed through it (see `on_link_routes`).
            let prefix_route = ip.gateway.is_none();
            self.pod
                .add_address(pod.index, ip.address, prefix_route)
                .await
                .cni(ErrorCode::IO, "cannot address the pod")?;
        }
        let routes = pod_routes(&allocation);
        for route in on_link_routes(&allocation, &routes).iter().chain(&routes) {
            self.pod.add_route(route.dst, route.gw, pod.index).await.cni(ErrorCode::IO, "cannot route in the pod")?;
        }
        for ip in &ips {
            let host_route = IpNetwork::new(*ip, if ip.is_ipv4() { 32 } else { 128 }).expect("host prefix");
            self.node.add_route(host_route, None, host.index).await.cni(ErrorCode::IO, "cannot add host route")?;
        }
        // The pod's gateways are the host veth: resolved ahead, the pod never asks (see
        // `add_permanent_neighbour`). The node's side is left to resolve the pod: a plugin chained
        // after this one (tuning) may change the pod's MAC, which a permanent entry would not follow.
        for gw in allocation.ips.iter().filter_map(|ip| ip.gateway) {
            self.pod
                .add_permanent_neighbour(pod.index, gw, host.mac)
                .await
                .cni(ErrorCode::IO, "cannot add the gateway's neighbour entry")?;
        }
        fault::point("add:after-routes");
        // The node's primary network: its node-level settings come from the node file alone
        // (as the agent's preload has them), never from what this configuration's IPAM says.
        let (v4, v6) = match &self.conf.node_subnets {
            Some(node) => (node.v4, node.v6),
            None => (pod_subnet(&allocation), pod_subnet_v6(&allocation)),
        };
        let settings = Settings::resolve(self.conf, v4, v6, self.node).await?;
        let root = self.conf.bpffs_root();
        Datapath::mount_bpffs(&root)?;
        self.datapath_reached.set(true);
        let datapath = Datapath::lock(&root, &self.conf.name)?;
        if !datapath.is_loaded() {
            settings.warn_about_node();
        }
        datapath.ensure_loaded(&settings, self.node).await?;
        let bandwidth = &self.request.bandwidth;
        // Every datapath this build attaches to, the previous layout's (5b4a135, 52899e9) too,
        // honours an ingress limit (`ENDPOINT_SHAPED`). Egress shaping came after 5b4a135, within
        // layout v3: 5b4a135's programs lack its `FEATURES` bit (and the map).
        if bandwidth.egress.is_some() && !datapath.shapes_egress() {
            return Err(CniError::new(
                ErrorCode::DATAPATH,
                format!(
                    "network {}'s datapath was loaded by an earlier build, whose programs would skip an egress limit",
                    self.conf.name
                ),
            )
            .with_details(
                "its programs stay until the last pod they serve is deleted (an upgrade keeps running pods as they \
                 are); add pods with an egress limit after that",
            ));
        }
        let endpoint = Endpoint {
            host_ifindex: host.index,
            flags: if bandwidth.ingress.is_some() { ENDPOINT_SHAPED } else { 0 }
                | if bandwidth.egress.is_some() { ENDPOINT_EGRESS_SHAPED } else { 0 },
            owner: self.attachment.cookie(),
            pod_mac: pod.mac,
            host_mac: host.mac,
            stack_epoch: 0,
        };
        fault::point("add:after-load");
        let link_local = has_ipv6.then(|| sysctl::eui64_link_local(pod.mac));
        datapath.add_endpoints(&ips, link_local, endpoint, self.request.mac)?;
        fault::point("add:after-endpoints");
        datapath.attach(&host_ifname)?;
        fault::point("add:after-attach");
        if let Some(egress) = bandwidth.egress {
            self.limit_egress(host.index, egress, &alias).await?;
        }
        Ok(AddResult {
            interfaces: vec![
                Interface { name: host_ifname, mac: format_mac(host.mac), sandbox: None },
                Interface {
                    name: self.env.ifname.clone(),
                    mac: format_mac(pod.mac),
                    sandbox: self.env.netns.as_ref().map(|p| p.display().to_string()),
                },
            ],
            ips: allocation.ips.iter().map(|ip| IpConfig { interface: Some(1), ..ip.clone() }).collect(),
            routes,
            dns: allocation.dns.clone(),
        })
    }
}

impl Setup<'_> {
    /// A pod's address gets a host route through its veth, and the datapath delivers to
    /// endpoints before the node's stack sees a packet: a pod holding an address the node has
    /// (asked for with `ips` or `args`, or in a range written around it), or one outside the
    /// node file's `podCIDRs`, would take that address's traffic from the node.
    async fn refuse_foreign_addresses(&self, ips: &[IpAddr]) -> CniResult<()> {
        let refuse = |ip: &IpAddr, why: String| {
            Err(CniError::new(ErrorCode::INVALID_CONFIG, format!("pod address {ip} {why}"))
                .with_details("fix the IPAM ranges or the requested IPs"))
        };
        if let Some(ip) = ips.iter().find(|ip| !is_unicast_global_or_private(ip)) {
            return refuse(ip, "is not a unicast address a pod may hold (loopback, link-local, multicast…)".into());
        }
        if let Some(allowed) = &self.conf.allowed_pod_cidrs
            && let Some(ip) = ips.iter().find(|ip| !allowed.iter().any(|cidr| cidr.contains(**ip)))
        {
            let list: Vec<String> = allowed.iter().map(|c| c.to_string()).collect();
            return refuse(ip, format!("is outside the node file's podCIDRs ({})", list.join(", ")));
        }
        let configured = [self.conf.node_ip.map(IpAddr::V4), self.conf.node_ipv6.map(IpAddr::V6)];
        for ip in ips {
            let local = self.node.is_local_address(*ip).await.cni(ErrorCode::IO, "cannot look up the pod's address")?;
            if local || configured.contains(&Some(*ip)) {
                return refuse(ip, "is an address of the node".into());
            }
        }
        Ok(())
    }

    /// The `bandwidth` capability's ingress limit as a TBF qdisc on the host veth, the end of the
    /// pair that sends into the pod (the datapath delivers into a limited pod through it, see
    /// `ENDPOINT_SHAPED`); it goes with the veth pair. Without one the host veth's root slot is
    /// held by a `noqueue`, so that a chained `bandwidth` plugin fails ADD instead of shaping
    /// only what crosses the stack. The egress limit is `limit_egress`.
    async fn limit_bandwidth(&self, host_index: u32) -> CniResult<()> {
        match self.request.bandwidth.ingress {
            Some(ingress) => {
                self.node.add_tbf(host_index, ingress).await.cni(ErrorCode::IO, "cannot limit what the pod receives")?
            }
            None => {
                self.node.hold_root_qdisc(host_index).await.cni(ErrorCode::IO, "cannot set the host veth's qdisc")?
            }
        }
        Ok(())
    }

    /// The egress limit as a TBF qdisc on an IFB device of the node, fed by a filter on the host
    /// veth's ingress after `from_pod` (`net/ifb.rs`): not on the pod's own interface, where a
    /// packet socket with `PACKET_QDISC_BYPASS` would skip it. The IFB carries the host veth's
    /// alias (GC finds it by that) and goes in DEL (`teardown`), or in this ADD's rollback.
    async fn limit_egress(&self, host_index: u32, egress: Limit, alias: &str) -> CniResult<()> {
        let name = self.attachment.ifb_name();
        let ifb =
            self.node.add_ifb(&name, self.conf.mtu).await.cni(ErrorCode::IO, "cannot create the egress limit's IFB")?;
        fault::point("add:after-ifb");
        self.node.set_alias(ifb, alias).await.cni(ErrorCode::IO, "cannot label the IFB")?;
        self.node.add_tbf(ifb, egress).await.cni(ErrorCode::IO, "cannot limit what the pod sends")?;
        self.node.set_up(ifb).await.cni(ErrorCode::IO, "cannot set the IFB up")?;
        self.node
            .redirect_ingress(host_index, ifb)
            .await
            .cni(ErrorCode::IO, "cannot send what the pod sends through its IFB")
    }

    /// Both ends' IPv6 settings (`sysctl.rs`), before either comes up.
    fn ipv6_settings(&self, host_ifname: &str) -> CniResult<()> {
        let no_ipv6 = |e: std::io::Error| {
            CniError::new(ErrorCode::IO, "cannot set up IPv6 on the veth pair")
                .with_details(format!("{e} (is IPv6 disabled in the node or the pod?)"))
        };
        sysctl::apply(host_ifname, &sysctl::HOST).map_err(no_ipv6)?;
        let ifname = &self.env.ifname;
        self.pod_ns
            .run(|| sysctl::apply(ifname, &sysctl::POD))
            .cni(ErrorCode::IO, "cannot enter the pod's network namespace")?
            .map_err(no_ipv6)
    }
}

/// IPv6 off on the host veth of a pod that has none (`sysctl::HOST_NO_IPV6` says why), before
/// it comes up. Nothing depends on it: on a node without IPv6 there is nothing to turn off, and
/// where it cannot be written the veth just keeps its link-local address, as before.
fn no_ipv6_on_host(host_ifname: &str) {
    match sysctl::apply(host_ifname, &sysctl::HOST_NO_IPV6) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            log::warn!("cannot turn IPv6 off on {host_ifname} (DEL then walks the node's IPv6 routes): {e}")
        }
        _ => {}
    }
}

/// The subnet of the pod's first IPv4 address: the cluster CIDR unless the config names one.
/// None for an IPv6-only pod.
fn pod_subnet(allocation: &Allocation) -> Option<Ipv4Network> {
    allocation.ips.iter().find_map(|ip| match ip.address {
        IpNetwork::V4(net) => Ipv4Network::new(net.network(), net.prefix()).ok(),
        IpNetwork::V6(_) => None,
    })
}

/// The same for IPv6.
fn pod_subnet_v6(allocation: &Allocation) -> Option<Ipv6Network> {
    allocation.ips.iter().find_map(|ip| match ip.address {
        IpNetwork::V6(net) => Ipv6Network::new(net.network(), net.prefix()).ok(),
        IpNetwork::V4(_) => None,
    })
}

/// IPAM's routes, or a default route; each without a gateway goes via the address's gateway.
fn pod_routes(allocation: &Allocation) -> Vec<Route> {
    let configured = if allocation.routes.is_empty() {
        // A default route per family the pod has an address of.
        let has = |v4: bool| allocation.ips.iter().any(|ip| ip.address.is_ipv4() == v4);
        [("0.0.0.0/0", true), ("::/0", false)]
            .into_iter()
            .filter(|(_, v4)| has(*v4))
            .map(|(dst, _)| Route { dst: dst.parse().expect("literal"), gw: None })
            .collect()
    } else {
        allocation.routes.clone()
    };
    // A route without a gateway goes via the gateway of an address of its family.
    let gateway =
        |dst: &IpNetwork| allocation.ips.iter().filter_map(|ip| ip.gateway).find(|gw| gw.is_ipv4() == dst.is_ipv4());
    configured.into_iter().map(|r| Route { gw: r.gw.or_else(|| gateway(&r.dst)), ..r }).collect()
}

/// What the pod's addresses (added without prefix routes) need before `routes`: the gateway
/// on-link, then each address's subnet via the gateway, unless `routes` has that subnet already.
fn on_link_routes(allocation: &Allocation, routes: &[Route]) -> Vec<Route> {
    let mut extra: Vec<Route> = Vec::new();
    for ip in &allocation.ips {
        let Some(gw) = ip.gateway else { continue };
        let host =
            Route { dst: IpNetwork::new(gw, if gw.is_ipv4() { 32 } else { 128 }).expect("host prefix"), gw: None };
        let subnet = IpNetwork::new(ip.address.network(), ip.address.prefix()).expect("same prefix");
        let via = Route { dst: subnet, gw: Some(gw) };
        for route in [host, via] {
            if !extra.contains(&route) && !routes.iter().any(|r| r.dst == route.dst) {
                extra.push(route);
            }
        }
    }
    extra
}

/// Not loopback, link-local (169.254/16 holds cloud metadata services), multicast, broadcast or
/// unspecified: none is an address a pod may hold.
fn is_unicast_global_or_private(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback() || v4.is_link_local() || v4.is_multicast() || v4.is_broadcast() || v4.octets()[0] == 0)
        }
        IpAddr::V6(v6) => !(v6.is_loopback() || v6.is_unicast_link_local() || v6.is_multicast() || v6.is_unspecified()),
    }
}

fn gone(name: &str) -> CniError {
    CniError::new(ErrorCode::INTERNAL, format!("interface {name} vanished right after it was created"))
}
