//! The node agent's routes (host-gw): one per other node, `podCIDR via internalIP`, marked with
//! our own route protocol number so that the agent finds, replaces and removes its routes and
//! never touches anyone else's.
use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use ipnetwork::Ipv4Network;
use rtnetlink::{
    RouteMessageBuilder,
    packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol},
};

use super::netlink::Netlink;

/// `proto 236` in `ip route`: routes the agent owns. Unassigned in iproute2's rt_protos.
pub const AGENT_ROUTE_PROTOCOL: u8 = 236;

fn ours() -> RouteProtocol {
    RouteProtocol::Other(AGENT_ROUTE_PROTOCOL)
}

fn agent_route(dst: Ipv4Network, gw: Ipv4Addr) -> RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst.network(), dst.prefix())
        .gateway(gw)
        .protocol(ours())
        .build()
}

impl Netlink {
    /// The agent's routes in the main table: (destination, gateway).
    pub async fn agent_routes(&self) -> Result<Vec<(Ipv4Network, Ipv4Addr)>> {
        let mut routes = self.handle.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
        let mut found = Vec::new();
        while let Some(route) = routes.try_next().await.context("listing routes")? {
            if route.header.table != RouteHeader::RT_TABLE_MAIN || route.header.protocol != ours() {
                continue;
            }
            let (mut dst, mut gw) = (Ipv4Addr::UNSPECIFIED, None);
            for attr in &route.attributes {
                match attr {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = *ip,
                    RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(*ip),
                    _ => {}
                }
            }
            if let (Ok(dst), Some(gw)) = (Ipv4Network::new(dst, route.header.destination_prefix_length), gw) {
                found.push((dst, gw));
            }
        }
        Ok(found)
    }

    /// Adds `dst via gw`, or changes the gateway of an existing route to `dst`.
    pub async fn set_agent_route(&self, dst: Ipv4Network, gw: Ipv4Addr) -> Result<()> {
        let request = self.handle.route().add(agent_route(dst, gw)).replace();
        request.execute().await.with_context(|| format!("route {dst} via {gw}"))
    }

    pub async fn delete_agent_route(&self, dst: Ipv4Network, gw: Ipv4Addr) -> Result<()> {
        let request = self.handle.route().del(agent_route(dst, gw));
        request.execute().await.with_context(|| format!("deleting route {dst} via {gw}"))
    }
}
