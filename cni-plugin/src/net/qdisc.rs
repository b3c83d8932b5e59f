//! Root qdiscs of a veth pair, over rtnetlink: a token bucket filter (sch_tbf) for a bandwidth
//! limit, or an explicit `noqueue` that holds the host veth's root slot (the default one may be
//! replaced by anyone: a chained `bandwidth` plugin would put a TBF there that our fast paths
//! skip). netlink-packet-route has no TBF options, so they are laid out here as the kernel's
//! `struct tc_tbf_qopt` and attributes (include/uapi/linux/pkt_sched.h). The rate table that
//! old kernels wanted is left out: a rate spec with a link layer needs none.
use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use rtnetlink::{
    packet_core::{
        DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload, Nla as _,
        NlasIterator,
    },
    packet_route::{
        RouteNetlinkMessage,
        tc::{TcAttribute, TcHandle, TcMessage, TcOption},
    },
};

use super::netlink::Netlink;
use crate::cni::bandwidth::Limit;

const TBF: &str = "tbf";
/// No queue at all: packets go straight to the device, as with a veth's default root qdisc.
const NOQUEUE: &str = "noqueue";
const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
/// `TC_LINKLAYER_ETHERNET`: sizes are whole frames.
const LINKLAYER_ETHERNET: u8 = 1;
/// The kernel's scheduler clock: one tick is 64 ns (`PSCHED_SHIFT`).
const NS_PER_TICK: u64 = 64;
/// How long a packet may wait in the queue at the limit's rate before it is dropped, as the
/// reference `bandwidth` plugin sizes it: the queue holds this much on top of the burst.
const QUEUE_LATENCY_MS: u64 = 25;

impl Netlink {
    /// Adds a TBF root qdisc to the link: `limit.rate` bits per second, `limit.burst` bits at
    /// once. Fails if the link has a root qdisc already (another plugin's shaping).
    pub async fn add_tbf(&self, index: u32, limit: Limit) -> Result<()> {
        let rate = limit.rate_bytes();
        let burst = limit.burst_bytes();
        let queue = (rate.saturating_mul(QUEUE_LATENCY_MS) / 1000).saturating_add(u64::from(burst));
        let options = vec![
            TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, parms(rate, burst, queue.min(u64::from(u32::MAX)) as u32))),
            TcOption::Other(DefaultNla::new(TCA_TBF_RATE64, rate.to_ne_bytes().to_vec())),
            TcOption::Other(DefaultNla::new(TCA_TBF_BURST, burst.to_ne_bytes().to_vec())),
        ];
        self.add_root_qdisc(index, TBF, Some(options)).await
    }

    /// Gives the link an explicit `noqueue` root qdisc: the same transmit path as the default,
    /// but one that a later `tc qdisc add … root` is refused to replace.
    pub async fn hold_root_qdisc(&self, index: u32) -> Result<()> {
        self.add_root_qdisc(index, NOQUEUE, None).await
    }

    async fn add_root_qdisc(&self, index: u32, kind: &str, options: Option<Vec<TcOption>>) -> Result<()> {
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::ROOT;
        message.attributes.push(TcAttribute::Kind(kind.into()));
        message.attributes.extend(options.map(TcAttribute::Options));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(message));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        let mut response = self.handle.clone().request(request).with_context(|| format!("sending a {kind} qdisc"))?;
        while let Some(reply) = response.next().await {
            if let NetlinkPayload::Error(e) = reply.payload {
                return Err(rtnetlink::Error::NetlinkError(e)).with_context(|| format!("adding a {kind} root qdisc"));
            }
        }
        Ok(())
    }

    /// The link's TBF root qdisc as a limit (the burst read back through the kernel's clock,
    /// so within a few bytes of what was set), or None when its root qdisc is something else.
    pub async fn root_tbf(&self, index: u32) -> Result<Option<Limit>> {
        let mut qdiscs = self.handle.qdisc().get().index(index as i32).execute();
        while let Some(msg) = qdiscs.try_next().await.context("listing qdiscs")? {
            // A dump may list every link's qdiscs: pick this link's root.
            if msg.header.index != index as i32 || msg.header.parent != TcHandle::ROOT {
                continue;
            }
            if !msg.attributes.iter().any(|a| matches!(a, TcAttribute::Kind(k) if k == TBF)) {
                return Ok(None);
            }
            let options = msg.attributes.iter().find_map(|a| match a {
                TcAttribute::Options(options) => options.first(),
                _ => None,
            });
            let Some(TcOption::Other(nest)) = options else { bail!("TBF qdisc without options") };
            return read_limit(nest).map(Some);
        }
        Ok(None)
    }
}

/// `struct tc_tbf_qopt`: the rate spec, an empty peak rate spec, then limit, buffer, mtu.
fn parms(rate: u64, burst: u32, queue: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(36);
    // struct tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate (32-bit: the
    // 64-bit rate goes in TCA_TBF_RATE64, which the kernel prefers when larger).
    bytes.extend([0, LINKLAYER_ETHERNET]);
    bytes.extend(0u16.to_ne_bytes());
    bytes.extend(0i16.to_ne_bytes());
    bytes.extend(0u16.to_ne_bytes());
    bytes.extend((rate.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    bytes.extend([0u8; 12]);
    bytes.extend(queue.to_ne_bytes());
    bytes.extend(burst_ticks(rate, burst).to_ne_bytes());
    bytes.extend(0u32.to_ne_bytes());
    bytes
}

/// The time `burst` bytes take at `rate` bytes per second, in scheduler ticks.
fn burst_ticks(rate: u64, burst: u32) -> u32 {
    let ns = u128::from(burst) * 1_000_000_000 / u128::from(rate.max(1));
    (ns / u128::from(NS_PER_TICK)).min(u128::from(u32::MAX)) as u32
}

/// Rate and burst out of a dumped TBF's options: `TCA_TBF_PARMS` (rate, and the burst as a
/// buffer time) and `TCA_TBF_RATE64` when the rate needs it.
fn read_limit(nest: &DefaultNla) -> Result<Limit> {
    let mut bytes = vec![0; nest.value_len()];
    nest.emit_value(&mut bytes);
    let (mut rate, mut buffer_ticks) = (None, None);
    for nla in NlasIterator::new(&bytes[..]) {
        let nla = nla.context("malformed TBF options")?;
        let word = |at: usize| nla.value().get(at..at + 4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")));
        match nla.kind() {
            TCA_TBF_PARMS => {
                rate = rate.or(word(8).map(u64::from));
                buffer_ticks = word(28);
            }
            TCA_TBF_RATE64 => {
                rate = nla.value().get(..8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
            }
            _ => {}
        }
    }
    let (Some(rate), Some(ticks)) = (rate, buffer_ticks) else { bail!("TBF options without rate or buffer") };
    let burst = u128::from(ticks) * u128::from(NS_PER_TICK) * u128::from(rate) / 1_000_000_000;
    Ok(Limit { rate: rate * 8, burst: (burst * 8) as u64 })
}

/// Whether a limit read back from the kernel is the one asked for: the same rate, and the
/// burst within what the kernel's 64 ns clock rounds away.
pub fn same_limit(asked: Limit, found: Limit) -> bool {
    let tick_bits = asked.rate_bytes() * 8 * NS_PER_TICK / 1_000_000_000 + 64;
    asked.rate_bytes() == found.rate_bytes() && asked.burst.abs_diff(found.burst) <= tick_bits.max(asked.burst / 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parms_round_trip_through_the_dump_layout() {
        let asked = Limit { rate: 20_000_000, burst: 400_000 };
        let mut nest = Vec::new();
        for (kind, value) in [
            (TCA_TBF_PARMS, parms(asked.rate_bytes(), asked.burst_bytes(), 100_000)),
            (TCA_TBF_RATE64, asked.rate_bytes().to_ne_bytes().to_vec()),
        ] {
            nest.extend(((value.len() + 4) as u16).to_ne_bytes());
            nest.extend(kind.to_ne_bytes());
            nest.extend(&value);
            nest.resize(nest.len().next_multiple_of(4), 0);
        }
        assert_eq!(parms(1, 1, 1).len(), 36);
        let found = read_limit(&DefaultNla::new(2, nest)).unwrap();
        assert!(same_limit(asked, found), "{asked:?} read back as {found:?}");
        assert!(!same_limit(Limit { rate: 10_000_000, ..asked }, found));
    }
}
