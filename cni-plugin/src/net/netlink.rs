//! rtnetlink operations the plugin needs, on a connection bound to one network namespace.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context as _, Result, anyhow};
use futures::TryStreamExt as _;
use ipnetwork::IpNetwork;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        address::AddressMessage,
        address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressScope},
        link::{InfoData, InfoVeth, LinkAttribute, LinkMessage},
        route::{RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteScope, RouteType},
        tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcOption},
    },
};

use super::netns::Netns;

/// An address that only a default route covers on a node: TEST-NET-3 (RFC 5737), for
/// documentation, never a host, so no node routes it on its own. Looked up, never sent to.
const OUTSIDE_PROBE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);

/// `ENODEV`/`ENOENT` from the kernel: the object is already gone.
fn is_not_found(err: &rtnetlink::Error) -> bool {
    matches!(err, rtnetlink::Error::NetlinkError(m) if m.raw_code().abs() == libc::ENODEV || m.raw_code().abs() == libc::ENOENT)
}

fn is_invalid(err: &rtnetlink::Error) -> bool {
    matches!(err, rtnetlink::Error::NetlinkError(m) if m.raw_code().abs() == libc::EINVAL)
}

fn bpf_program_ids(attr: &TcAttribute) -> Vec<u32> {
    let TcAttribute::Options(options) = attr else { return Vec::new() };
    options
        .iter()
        .filter_map(|o| match o {
            TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => Some(*id),
            _ => None,
        })
        .collect()
}

/// A cls_bpf filter: where it sits (priority, handle) and the program it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfFilter {
    pub priority: u16,
    pub handle: u32,
    pub program_id: u32,
}

/// A route as CHECK compares it with a result's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
}

/// A link as far as the plugin cares.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub index: u32,
    pub mac: [u8; 6],
}

pub struct Netlink {
    pub(super) handle: Handle,
    /// A socket with `NETLINK_GET_STRICT_CHK`, on which the kernel honours a dump's filters
    /// (an address dump's link index) instead of sending everything: a node's address dump
    /// holds every host veth's link-local address. Not `handle`: strict checking would also
    /// make the kernel filter route dumps by the table, protocol and type of their request.
    strict: Handle,
}

impl Netlink {
    /// A connection in the calling thread's namespace. Needs a tokio runtime.
    pub fn connect() -> Result<Self> {
        let (conn, handle, _) = rtnetlink::new_connection().context("netlink socket")?;
        tokio::spawn(conn);
        let (conn, strict, _) = rtnetlink::new_connection_with_strict_check().context("netlink socket")?;
        tokio::spawn(conn);
        Ok(Self { handle, strict })
    }

    /// A connection whose socket lives in `ns`, usable from here.
    pub fn connect_in(ns: &Netns) -> Result<Self> {
        ns.run(Self::connect).context("entering the pod's network namespace")?
    }

    pub async fn link(&self, name: &str) -> Result<Option<Link>> {
        let mut links = self.handle.link().get().match_name(name.to_string()).execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(Some(to_link(&msg)?)),
            Ok(None) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
        }
    }

    /// Creates `host` here and its peer `pod_ifname` directly inside `pod_ns`, both down; the
    /// peer gets `pod_mac` when the runtime asked for one.
    pub async fn add_veth(
        &self,
        host: &str,
        pod_ifname: &str,
        pod_ns: &Netns,
        mtu: Option<u32>,
        pod_mac: Option<[u8; 6]>,
    ) -> Result<()> {
        let mut peer = LinkMessageBuilder::<LinkUnspec>::new().name(pod_ifname).setns_by_fd(pod_ns.raw_fd());
        let mut builder = LinkVeth::new(host, pod_ifname);
        if let Some(mtu) = mtu {
            peer = peer.mtu(mtu);
            builder = builder.mtu(mtu);
        }
        if let Some(mac) = pod_mac {
            peer = peer.address(mac.to_vec());
        }
        let message = builder.set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build()))).build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .with_context(|| format!("creating veth {host} <-> {pod_ifname}"))
    }

    /// Sets the interface alias (`ip link` shows it); the kernel ignores one given at creation.
    pub async fn set_alias(&self, index: u32, alias: &str) -> Result<()> {
        let message = LinkUnspec::new_with_index(index).alias(alias).build();
        self.handle.link().set(message).execute().await.context("setting link alias")
    }

    /// Every link whose alias starts with `prefix`: (name, alias).
    pub async fn links_by_alias(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut links = self.handle.link().get().execute();
        let mut found = Vec::new();
        while let Some(msg) = links.try_next().await.context("listing links")? {
            let (mut name, mut alias) = (None, None);
            for attr in &msg.attributes {
                match attr {
                    LinkAttribute::IfName(n) => name = Some(n.clone()),
                    LinkAttribute::IfAlias(a) => alias = Some(a.clone()),
                    _ => {}
                }
            }
            if let (Some(name), Some(alias)) = (name, alias.filter(|a| a.starts_with(prefix))) {
                found.push((name, alias));
            }
        }
        Ok(found)
    }

    pub async fn set_up(&self, index: u32) -> Result<()> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.handle.link().set(message).execute().await.context("setting link up")
    }

    /// Adds `address` with its prefix; with `prefix_route` false, without the subnet route the
    /// kernel would add (`noprefixroute`). A pod then reaches its subnet through the gateway,
    /// with one ARP entry, instead of resolving every peer on-link: per-peer entries count
    /// against the neighbour table limit (gc_thresh3, 1,024 by default) that all network
    /// namespaces share, and 64 pods talking to each other overflow it (sends fail, ENOBUFS).
    ///
    /// IPv6 addresses skip duplicate address detection (`nodad`): IPAM made the address unique,
    /// and a tentative address could not be used for the pod's first second.
    pub async fn add_address(&self, index: u32, address: IpNetwork, prefix_route: bool) -> Result<()> {
        let mut request = self.handle.address().add(index, address.ip(), address.prefix());
        let mut flags = AddressFlags::empty();
        if !prefix_route {
            flags |= AddressFlags::Noprefixroute;
        }
        if address.is_ipv6() {
            flags |= AddressFlags::Nodad;
        }
        if !flags.is_empty() {
            request.message_mut().attributes.push(AddressAttribute::Flags(flags));
        }
        request.execute().await.with_context(|| format!("adding address {address}"))
    }

    /// A permanent neighbour entry: `ip` is at `mac` on link `index`. Permanent entries are
    /// exempt from the neighbour table's limit (gc_thresh3, 1,024 by default), which every
    /// network namespace shares: a thousand pods each resolving its gateway would fill it, and
    /// then new entries fail machine-wide.
    pub async fn add_permanent_neighbour(&self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()> {
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .with_context(|| format!("adding neighbour {ip}"))
    }

    /// `dst via gw dev index`, or `dst dev index scope link` when there is no gateway.
    pub async fn add_route(&self, dst: IpNetwork, gw: Option<IpAddr>, index: u32) -> Result<()> {
        let message = route_message(dst, gw, index)?;
        self.handle.route().add(message).execute().await.with_context(|| format!("adding route {dst}"))
    }

    /// Deletes the route [`Self::add_route`] added with the same arguments; one that is not
    /// there is not an error.
    pub async fn delete_route(&self, dst: IpNetwork, gw: Option<IpAddr>, index: u32) -> Result<()> {
        let message = route_message(dst, gw, index)?;
        match self.handle.route().del(message).execute().await {
            Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code().abs() == libc::ESRCH => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            other => other.with_context(|| format!("deleting route {dst}")),
        }
    }
}

fn route_message(dst: IpNetwork, gw: Option<IpAddr>, index: u32) -> Result<RouteMessage> {
    Ok(match (dst, gw) {
        (IpNetwork::V4(net), gw) => {
            let builder = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(net.network(), net.prefix())
                .output_interface(index);
            match gw {
                Some(IpAddr::V4(gw)) => builder.gateway(gw),
                Some(IpAddr::V6(gw)) => return Err(anyhow!("route {dst} via {gw}: an IPv6 gateway")),
                None => builder.scope(RouteScope::Link),
            }
            .build()
        }
        (IpNetwork::V6(net), gw) => {
            let builder = RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(net.network(), net.prefix())
                .output_interface(index);
            match gw {
                Some(IpAddr::V6(gw)) => builder.gateway(gw),
                Some(IpAddr::V4(gw)) => return Err(anyhow!("route {dst} via {gw}: an IPv4 gateway")),
                None => builder.scope(RouteScope::Link),
            }
            .build()
        }
    })
}

impl Netlink {
    /// The interface of the IPv4 default route in the main table (the lowest metric wins).
    /// One route lookup (`default_route_by_lookup`) where it answers, a dump of the table (a
    /// /32 per pod) where it cannot.
    pub async fn default_route_ifindex(&self) -> Result<Option<u32>> {
        match self.default_route_by_lookup().await {
            Some(index) => Ok(Some(index)),
            None => self.default_route_by_dump().await,
        }
    }

    /// The route the kernel picks for `OUTSIDE_PROBE` (`ip route get fibmatch`), when that is
    /// the main table's default route through one interface: the main table's first usable
    /// default route, the one of lowest metric. None when the probe has a more specific route,
    /// a policy rule took it to another table, the route has several next hops or none, or the
    /// lookup failed: the dump decides then.
    async fn default_route_by_lookup(&self) -> Option<u32> {
        let mut request = RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(OUTSIDE_PROBE, 32).build();
        request.header.flags |= RouteFlags::FibMatch;
        let route = self.handle.route().get(request).execute().try_next().await.ok()??;
        let table = route
            .attributes
            .iter()
            .find_map(|a| if let RouteAttribute::Table(t) = a { Some(*t) } else { None })
            .unwrap_or(u32::from(route.header.table));
        let multipath = route.attributes.iter().any(|a| matches!(a, RouteAttribute::MultiPath(_)));
        if route.header.destination_prefix_length != 0 || table != u32::from(RouteHeader::RT_TABLE_MAIN) || multipath {
            return None;
        }
        route.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None })
    }

    async fn default_route_by_dump(&self) -> Result<Option<u32>> {
        let request = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let mut routes = self.handle.route().get(request).execute();
        let mut best: Option<(u32, u32)> = None;
        while let Some(route) = routes.try_next().await.context("listing routes")? {
            let header = &route.header;
            if header.destination_prefix_length != 0 || header.table != RouteHeader::RT_TABLE_MAIN {
                continue;
            }
            let attr = |pick: fn(&RouteAttribute) -> Option<u32>| route.attributes.iter().find_map(pick);
            let Some(oif) = attr(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None }) else { continue };
            let metric = attr(|a| if let RouteAttribute::Priority(p) = a { Some(*p) } else { None }).unwrap_or(0);
            if best.is_none_or(|(m, _)| metric < m) {
                best = Some((metric, oif));
            }
        }
        Ok(best.map(|(_, oif)| oif))
    }

    /// The addresses of one family (`Unspec`: both) of one link, filtered by the kernel (a
    /// strict-check dump): a node's address dump holds every host veth's link-local address.
    fn link_addresses(
        &self,
        index: u32,
        family: AddressFamily,
    ) -> impl futures::Stream<Item = Result<AddressMessage, rtnetlink::Error>> {
        let mut request = self.strict.address().get();
        request.message_mut().header.index = index;
        request.message_mut().header.family = family;
        // Also kept in userspace: a kernel without strict dumps ignores the header's index.
        request.set_link_index_filter(index).execute()
    }

    /// The first primary (not secondary), global IPv4 address of a link.
    pub async fn primary_ipv4(&self, index: u32) -> Result<Option<Ipv4Addr>> {
        let mut addresses = std::pin::pin!(self.link_addresses(index, AddressFamily::Inet));
        while let Some(msg) = addresses.try_next().await.context("listing addresses")? {
            let h = &msg.header;
            if h.family != AddressFamily::Inet
                || h.scope != AddressScope::Universe
                || h.flags.contains(AddressHeaderFlags::Secondary)
            {
                continue;
            }
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(ip)) | AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                _ => None,
            });
            if local.is_some() {
                return Ok(local);
            }
        }
        Ok(None)
    }

    /// The link's first global IPv6 address that is usable now: not tentative (duplicate
    /// address detection still running), not deprecated, not a temporary (privacy) one.
    pub async fn primary_ipv6(&self, index: u32) -> Result<Option<Ipv6Addr>> {
        let mut addresses = std::pin::pin!(self.link_addresses(index, AddressFamily::Inet6));
        let unusable = AddressHeaderFlags::Tentative | AddressHeaderFlags::Deprecated | AddressHeaderFlags::Secondary;
        while let Some(msg) = addresses.try_next().await.context("listing addresses")? {
            let h = &msg.header;
            if h.family != AddressFamily::Inet6 || h.scope != AddressScope::Universe || h.flags.intersects(unusable) {
                continue;
            }
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V6(ip)) => Some(*ip),
                _ => None,
            });
            if address.is_some() {
                return Ok(address);
            }
        }
        Ok(None)
    }

    /// The addresses of a link (with their prefix lengths).
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>> {
        let mut addresses = std::pin::pin!(self.link_addresses(index, AddressFamily::Unspec));
        let mut found = Vec::new();
        while let Some(msg) = addresses.try_next().await.context("listing addresses")? {
            let ip = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(net) = ip.and_then(|ip| IpNetwork::new(ip, msg.header.prefix_len).ok()) {
                found.push(net);
            }
        }
        Ok(found)
    }

    /// Whether `ip` is one of the node's own addresses: the kernel's route to it is a local
    /// one. One lookup, however many interfaces (and link-local addresses of host veths) the
    /// node has, where a dump of every address grows with the pods.
    pub async fn is_local_address(&self, ip: IpAddr) -> Result<bool> {
        let request = match ip {
            IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(v4, 32).build(),
            IpAddr::V6(v6) => RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(v6, 128).build(),
        };
        let mut answer = self.handle.route().get(request).execute();
        let node_owned = [RouteType::Local, RouteType::Broadcast, RouteType::Anycast];
        match answer.try_next().await {
            Ok(route) => Ok(route.is_some_and(|r| node_owned.contains(&r.header.kind))),
            // No route, or a blackhole, unreachable or prohibit one: the `local` table, looked up
            // first, did not have it either.
            Err(rtnetlink::Error::NetlinkError(e))
                if [libc::ENETUNREACH, libc::EHOSTUNREACH, libc::EINVAL, libc::EACCES].contains(&-e.raw_code()) =>
            {
                Ok(false)
            }
            Err(e) => Err(e).with_context(|| format!("looking up the route to {ip}")),
        }
    }

    /// Routes of the main table, both families, that leave by `index`.
    pub async fn routes_via(&self, index: u32) -> Result<Vec<RouteEntry>> {
        let mut found = Vec::new();
        for request in [RouteMessageBuilder::<Ipv4Addr>::new().build(), RouteMessageBuilder::<Ipv6Addr>::new().build()]
        {
            let mut routes = self.handle.route().get(request).execute();
            while let Some(route) = routes.try_next().await.context("listing routes")? {
                if route.header.table != RouteHeader::RT_TABLE_MAIN {
                    continue;
                }
                let leaves_by = route.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                });
                if leaves_by != Some(index) {
                    continue;
                }
                if let Some((dst, gw)) = destination_and_gateway(&route) {
                    found.push(RouteEntry { dst, gw });
                }
            }
        }
        Ok(found)
    }

    /// Ids of the BPF programs that the tc (cls_bpf) filters on one side of the link's clsact run.
    pub async fn bpf_filter_programs(&self, index: u32, ingress: bool) -> Result<Vec<u32>> {
        Ok(self.bpf_filters(index, ingress).await?.into_iter().map(|f| f.program_id).collect())
    }

    /// Deletes the link's clsact qdisc if no filter of any kind is left under it (one we added
    /// for our own filters and that nobody else uses); returns whether it did.
    pub async fn delete_clsact_if_unused(&self, index: u32) -> Result<bool> {
        for ingress in [true, false] {
            let request = self.handle.traffic_filter(index as i32).get();
            let mut filters = if ingress { request.ingress() } else { request.egress() }.execute();
            match filters.try_next().await {
                Ok(None) => {}
                Ok(Some(_)) => return Ok(false),
                Err(e) if is_not_found(&e) || is_invalid(&e) => return Ok(false), // no clsact at all
                Err(e) => return Err(e).context("listing tc filters"),
            }
        }
        let mut request = self.handle.qdisc().del(index as i32);
        request.message_mut().header.parent = TcHandle::CLSACT;
        request.message_mut().header.handle = TcHandle { major: 0xffff, minor: 0 };
        // Named, so that the kernel refuses rather than delete a qdisc of another kind.
        request.message_mut().attributes.push(TcAttribute::Kind("clsact".into()));
        match request.execute().await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) || is_invalid(&e) => Ok(false),
            Err(e) => Err(e).context("deleting the clsact qdisc"),
        }
    }

    /// The tc (cls_bpf) filters on one side of the link's clsact, in run order.
    pub async fn bpf_filters(&self, index: u32, ingress: bool) -> Result<Vec<BpfFilter>> {
        let request = self.handle.traffic_filter(index as i32).get();
        let mut filters = if ingress { request.ingress() } else { request.egress() }.execute();
        let mut found = Vec::new();
        loop {
            match filters.try_next().await {
                Ok(Some(msg)) => {
                    // tcm_info holds the priority in its upper half.
                    let (priority, handle) = ((msg.header.info >> 16) as u16, u32::from(msg.header.handle));
                    found.extend(msg.attributes.iter().flat_map(bpf_program_ids).map(|program_id| BpfFilter {
                        priority,
                        handle,
                        program_id,
                    }));
                }
                Ok(None) => break,
                // A link without a clsact qdisc has no filters to list.
                Err(e) if is_not_found(&e) || is_invalid(&e) => break,
                Err(e) => return Err(e).context("listing tc filters"),
            }
        }
        Ok(found)
    }

    /// Every link of the namespace: (index, name, alias).
    pub async fn links(&self) -> Result<Vec<(u32, String, Option<String>)>> {
        let mut links = self.handle.link().get().execute();
        let mut found = Vec::new();
        while let Some(msg) = links.try_next().await.context("listing links")? {
            let (mut name, mut alias) = (String::new(), None);
            for attr in msg.attributes {
                match attr {
                    LinkAttribute::IfName(n) => name = n,
                    LinkAttribute::IfAlias(a) => alias = Some(a),
                    _ => {}
                }
            }
            found.push((msg.header.index, name, alias));
        }
        Ok(found)
    }

    pub async fn link_name(&self, index: u32) -> Result<Option<String>> {
        let mut links = self.handle.link().get().match_index(index).execute();
        match links.try_next().await {
            Ok(Some(msg)) => Ok(msg.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(name) => Some(name.clone()),
                _ => None,
            })),
            Ok(None) => Ok(None),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("looking up link {index}")),
        }
    }
}

fn to_link(msg: &LinkMessage) -> Result<Link> {
    let mac = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) if bytes.len() == 6 => bytes.as_slice().try_into().ok(),
            _ => None,
        })
        .ok_or_else(|| anyhow!("link {} has no MAC address", msg.header.index))?;
    Ok(Link { index: msg.header.index, mac })
}

/// `aa:bb:cc:dd:ee:ff`, as results and logs print it.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// The route's destination (with its prefix) and gateway, whichever the family.
pub fn destination_and_gateway(route: &RouteMessage) -> Option<(IpNetwork, Option<IpAddr>)> {
    let mut dst = match route.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let mut gw = None;
    for attr in &route.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = IpAddr::V4(*ip),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = IpAddr::V6(*ip),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some(IpAddr::V6(*ip)),
            _ => {}
        }
    }
    Some((IpNetwork::new(dst, route.header.destination_prefix_length).ok()?, gw))
}
