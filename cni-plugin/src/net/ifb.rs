//! Egress limits on the node's side of the veth pair, out of the pod's reach: an IFB
//! (intermediate functional block) device per limited pod, holding the limit's TBF as its root
//! qdisc, fed from the host veth's ingress by a classic tc filter (u32, match all) whose action
//! is `mirred egress redirect` to the IFB. The IFB hands every packet back to the host veth's
//! ingress once the TBF let it go, marked so that the hook's filters (`from_pod` and this one)
//! do not run again (`tc_skip_classify`), and the node's stack takes it from there.
//!
//! Why not the pod's own interface: a packet socket with `PACKET_QDISC_BYPASS` (`CAP_NET_RAW`
//! is enough, and pods have it) skips every qdisc there. Why an IFB per pod rather than one per
//! node with a class per pod: nothing to allocate or share (no class ids, no node-wide qdisc
//! that every ADD and DEL of a limited pod would edit under a lock), and DEL removes one device.
//! Why not a token bucket in `from_pod`: dropping above the rate makes TCP oscillate below it,
//! where the TBF's queue (25 ms at the rate, as on the pod's side before) holds it at the rate.
use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use rtnetlink::{
    LinkIfb,
    packet_route::tc::{
        TcActionAttribute, TcActionMirrorOption, TcActionOption, TcAttribute, TcFilterU32Option, TcMirrorActionType,
        TcOption,
    },
};

use super::netlink::Netlink;

/// Priority of the filter feeding the IFB, the lowest there is: it runs after every filter
/// with an automatic priority, `from_pod`'s among them (the kernel gives the first filter of a
/// hook 49152, and each later one one less), whichever was added first.
pub const REDIRECT_PRIORITY: u16 = u16::MAX;

/// ETH_P_ALL in the byte order tc wants (network order): every protocol, ARP and IPv6 included.
const ALL_PROTOCOLS: u16 = (libc::ETH_P_ALL as u16).to_be();

/// A filter on a link's ingress that redirects what it matches to another link's egress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Redirect {
    pub priority: u16,
    /// Index of the link the packets go to.
    pub target: u32,
}

impl Netlink {
    /// Creates the IFB device `name`, down, with the pod's MTU when the network sets one;
    /// returns its index.
    pub async fn add_ifb(&self, name: &str, mtu: Option<u32>) -> Result<u32> {
        let mut builder = LinkIfb::new(name);
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.handle.link().add(builder.build()).execute().await.with_context(|| format!("creating IFB {name}"))?;
        let link = self.link(name).await?.with_context(|| format!("IFB {name} vanished right after it was created"))?;
        Ok(link.index)
    }

    /// Sends everything arriving on `index` (the host veth) to the IFB `ifb_index`, after the
    /// hook's other filters (see [`REDIRECT_PRIORITY`]). The link needs a clsact qdisc.
    pub async fn redirect_ingress(&self, index: u32, ifb_index: u32) -> Result<()> {
        self.handle
            .traffic_filter(index as i32)
            .add()
            .ingress()
            .priority(REDIRECT_PRIORITY)
            .protocol(ALL_PROTOCOLS)
            .redirect(ifb_index)
            .context("building the redirect filter")?
            .execute()
            .await
            .context("adding the filter that feeds the IFB")
    }

    /// The filters on the link's ingress whose action redirects packets to another link's
    /// egress (`mirred egress redirect`), in run order.
    pub async fn ingress_redirects(&self, index: u32) -> Result<Vec<Redirect>> {
        let mut filters = self.handle.traffic_filter(index as i32).get().ingress().execute();
        let mut found = Vec::new();
        loop {
            let msg = match filters.try_next().await {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) if is_not_found_or_invalid(&e) => break, // no clsact qdisc: no filter
                Err(e) => return Err(e).context("listing tc filters"),
            };
            let priority = (msg.header.info >> 16) as u16;
            let options = msg.attributes.iter().filter_map(|a| match a {
                TcAttribute::Options(options) => Some(options),
                _ => None,
            });
            for option in options.flatten() {
                let TcOption::U32(TcFilterU32Option::Action(actions)) = option else { continue };
                for attribute in actions.iter().flat_map(|a| &a.attributes) {
                    let TcActionAttribute::Options(options) = attribute else { continue };
                    for option in options {
                        if let TcActionOption::Mirror(TcActionMirrorOption::Parms(mirror)) = option
                            && mirror.eaction == TcMirrorActionType::EgressRedir
                        {
                            found.push(Redirect { priority, target: mirror.ifindex });
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    /// Whether the link is up (administratively): an IFB that is down drops what it is sent.
    pub async fn is_up(&self, index: u32) -> Result<bool> {
        let mut links = self.handle.link().get().match_index(index).execute();
        let msg = links.try_next().await.context("looking up a link")?.context("no such link")?;
        Ok(msg.header.flags.contains(rtnetlink::packet_route::link::LinkFlags::Up))
    }
}

fn is_not_found_or_invalid(err: &rtnetlink::Error) -> bool {
    matches!(err, rtnetlink::Error::NetlinkError(m)
        if [libc::ENODEV, libc::ENOENT, libc::EINVAL].contains(&m.raw_code().abs()))
}
