//! The node agent's routes (host-gw): one per other node and family, `podCIDR via internalIP`,
//! marked with our own route protocol number so that the agent finds, changes and removes its
//! routes and never touches anyone else's.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result, anyhow};
use futures::TryStreamExt as _;
use ipnetwork::IpNetwork;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        route::{RouteHeader, RouteMessage, RouteProtocol, RouteType},
    },
};

use super::netlink::{Netlink, destination_and_gateway};

/// `proto 236` in `ip route`: routes the agent owns. Unassigned in iproute2's rt_protos.
pub const AGENT_ROUTE_PROTOCOL: u8 = 236;

fn ours() -> RouteProtocol {
    RouteProtocol::Other(AGENT_ROUTE_PROTOCOL)
}

fn agent_route(dst: IpNetwork, gw: IpAddr) -> Result<RouteMessage> {
    Ok(match (dst, gw) {
        (IpNetwork::V4(net), IpAddr::V4(gw)) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(net.network(), net.prefix())
            .gateway(gw)
            .protocol(ours())
            .build(),
        (IpNetwork::V6(net), IpAddr::V6(gw)) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(net.network(), net.prefix())
            .gateway(gw)
            .protocol(ours())
            .build(),
        _ => return Err(anyhow!("route {dst} via {gw}: the gateway is of the other address family")),
    })
}

/// The IPv4 and IPv6 routes of the main table, as the agent sorts them.
#[derive(Debug, Default)]
pub struct MainRoutes {
    /// The agent's: destination → gateway.
    pub ours: BTreeMap<IpNetwork, IpAddr>,
    /// Everyone else's (an admin's static route, a routing daemon's, the kernel's): destination →
    /// the route as `ip route` would show it, for the log.
    pub foreign: BTreeMap<IpNetwork, String>,
}

impl Netlink {
    pub async fn main_routes(&self) -> Result<MainRoutes> {
        let mut found = MainRoutes::default();
        let dumps = [
            (AddressFamily::Inet, RouteMessageBuilder::<Ipv4Addr>::new().build()),
            (AddressFamily::Inet6, RouteMessageBuilder::<Ipv6Addr>::new().build()),
        ];
        for (family, request) in dumps {
            let mut routes = self.handle.route().get(request).execute();
            while let Some(route) = routes.try_next().await.context("listing routes")? {
                // A kernel without IPv6 answers the IPv6 dump with every family's routes.
                if route.header.table != RouteHeader::RT_TABLE_MAIN || route.header.address_family != family {
                    continue;
                }
                let Some((dst, gw)) = destination_and_gateway(&route) else { continue };
                match gw {
                    Some(gw) if route.header.protocol == ours() => {
                        found.ours.insert(dst, gw);
                    }
                    _ => {
                        found.foreign.insert(dst, describe(&route, dst, gw));
                    }
                }
            }
        }
        Ok(found)
    }

    /// Adds `dst via gw`. Fails if any route to `dst` exists by now, so one someone else made
    /// since the agent last looked is not overwritten.
    pub async fn add_agent_route(&self, dst: IpNetwork, gw: IpAddr) -> Result<()> {
        let request = self.handle.route().add(agent_route(dst, gw)?);
        request.execute().await.map_err(|e| explain(e, dst, gw))
    }

    /// Changes the gateway of the agent's route to `dst`. The kernel replaces whichever route to
    /// `dst` it finds: the caller has checked that it is ours.
    pub async fn change_agent_route(&self, dst: IpNetwork, gw: IpAddr) -> Result<()> {
        let request = self.handle.route().add(agent_route(dst, gw)?).replace();
        request.execute().await.map_err(|e| explain(e, dst, gw))
    }

    /// Deletes the agent's `dst via gw`: the kernel matches the protocol too, so a route someone
    /// else made to the same destination cannot go instead.
    pub async fn delete_agent_route(&self, dst: IpNetwork, gw: IpAddr) -> Result<()> {
        let request = self.handle.route().del(agent_route(dst, gw)?);
        request.execute().await.with_context(|| format!("deleting route {dst} via {gw}"))
    }
}

/// The kernel's answer, with what it most likely means here.
fn explain(e: rtnetlink::Error, dst: IpNetwork, gw: IpAddr) -> anyhow::Error {
    let code = match &e {
        rtnetlink::Error::NetlinkError(m) => m.raw_code().abs(),
        _ => 0,
    };
    let hint = match code {
        // IPv6 says EHOSTUNREACH where IPv4 says ENETUNREACH.
        libc::ENETUNREACH | libc::EHOSTUNREACH => ": the gateway must be on a directly connected network",
        libc::EEXIST => ": a route to it appeared meanwhile, and is not the agent's",
        _ => "",
    };
    anyhow::Error::new(e).context(format!("route {dst} via {gw}{hint}"))
}

fn describe(route: &RouteMessage, dst: IpNetwork, gw: Option<IpAddr>) -> String {
    let kind = match route.header.kind {
        RouteType::Unicast => String::new(),
        other => format!("{other:?} ").to_lowercase(),
    };
    let via = gw.map(|gw| format!(" via {gw}")).unwrap_or_default();
    format!("{kind}{dst}{via} proto {}", route.header.protocol)
}
