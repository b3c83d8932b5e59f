//! The uplink's programs (masquerade out, replies in) as cls_bpf filters under the uplink's
//! clsact qdisc, as on the pods' veths. Not TCX: each TCX attach waits for an RCU grace period
//! (10–20 ms here), which made it the largest part of a network's first ADD; a filter does not.
//!
//! A filter belongs to the device, not to a pin, so the network finds its own by the ids of the
//! uplink programs it pinned, and removes them before those pins go (the last DEL, GC, or a
//! load that restarts after an interrupted one). Their pass verdict (`TC_ACT_UNSPEC`) lets the
//! uplink's other filters, whoever owns them, still run.
use aya::programs::{Link as _, ProgramInfo, TcAttachType, tc::SchedClassifierLink};
use ebpf_common::{DatapathConfig, names};

pub(super) use super::datapath::attach_filter as attach;
use super::datapath::{Datapath, internal};
use crate::{
    cni::{CniResult, Context, ErrorCode},
    net::netlink::Netlink,
};

/// Where each uplink program runs: IPv4's pair, then IPv6's (programs of their own: each has the
/// 512-byte stack to itself).
pub const PROGRAMS: [(&str, TcAttachType); 4] = [
    (names::TO_UPLINK, TcAttachType::Egress),
    (names::FROM_UPLINK, TcAttachType::Ingress),
    (names::TO_UPLINK6, TcAttachType::Egress),
    (names::FROM_UPLINK6, TcAttachType::Ingress),
];

/// Per-packet Service translation (kubeProxyReplacement), attached after the others so that it
/// runs first: `svc_from_uplink` before `from_uplink`, `svc_to_uplink` before `to_uplink`.
pub const SERVICE_PROGRAMS: [(&str, TcAttachType); 4] = [
    (names::SVC_FROM_UPLINK, TcAttachType::Ingress),
    (names::SVC_TO_UPLINK, TcAttachType::Egress),
    (names::SVC_FROM_UPLINK6, TcAttachType::Ingress),
    (names::SVC_TO_UPLINK6, TcAttachType::Egress),
];

/// The Service programs a network with these settings attaches: IPv6's only with IPv6 pods.
pub fn service_programs_for(config: &DatapathConfig) -> &'static [(&'static str, TcAttachType)] {
    if config.cluster_prefix6 != 0 { &SERVICE_PROGRAMS } else { &SERVICE_PROGRAMS[..2] }
}

/// The uplink programs a network with these settings attaches: IPv6's only with IPv6 pods, so
/// that an IPv4-only network's uplink runs one program each way, as before.
pub fn programs_for(config: &DatapathConfig) -> &'static [(&'static str, TcAttachType)] {
    if config.cluster_prefix6 != 0 { &PROGRAMS } else { &PROGRAMS[..2] }
}

impl Datapath {
    /// Removes the uplink filters running this network's pinned uplink programs; returns how
    /// many. Nothing to do without masquerade, or when no uplink program was pinned yet.
    pub(super) async fn detach_uplink(&self, node: &Netlink) -> CniResult<usize> {
        let Some(config) = self.recorded_settings()? else { return Ok(0) };
        if config.masquerade == 0 {
            return Ok(0);
        }
        let Some(uplink) =
            node.link_name(config.uplink_ifindex).await.cni(ErrorCode::IO, "cannot look up the uplink")?
        else {
            return Ok(0); // the uplink is gone, and its filters with it
        };
        let mut removed = 0;
        for (name, direction) in PROGRAMS.into_iter().chain(SERVICE_PROGRAMS) {
            let pin = self.pins.program(name);
            if !pin.exists() {
                continue;
            }
            let ours = ProgramInfo::from_pin(&pin).cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?.id();
            let ingress = direction == TcAttachType::Ingress;
            let filters = node
                .bpf_filters(config.uplink_ifindex, ingress)
                .await
                .cni(ErrorCode::DATAPATH, format!("cannot list {uplink}'s filters"))?;
            for filter in filters.iter().filter(|f| f.program_id == ours) {
                let link =
                    SchedClassifierLink::attached(&uplink, direction, filter.priority, filter.handle.into(), None)
                        .cni(ErrorCode::DATAPATH, format!("cannot find {uplink}'s filter"))?;
                link.detach().cni(ErrorCode::DATAPATH, format!("cannot remove {name} from {uplink}"))?;
                removed += 1;
            }
        }
        // A clsact this network added goes with its filters, unless someone else's filter has
        // come under it since. A filter another process adds between that look and the delete
        // (one netlink round trip) would go with it; this network's own ADDs wait on the flock.
        if self.pins.clsact_mark().exists() {
            node.delete_clsact_if_unused(config.uplink_ifindex)
                .await
                .cni(ErrorCode::DATAPATH, format!("cannot remove {uplink}'s clsact qdisc"))?;
        }
        Ok(removed)
    }

    /// Records that this network added the uplink's clsact qdisc (see `Pins::clsact_mark`).
    pub(super) fn mark_clsact_ours(&self) -> CniResult<()> {
        match std::fs::create_dir(self.pins.clsact_mark()) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(e).cni(ErrorCode::DATAPATH, "cannot record the uplink's clsact as ours")
            }
            _ => Ok(()),
        }
    }

    /// The settings the network's programs were loaded with, if it has pins.
    pub(super) fn recorded_settings(&self) -> CniResult<Option<DatapathConfig>> {
        if !self.pins.map(names::SETTINGS).exists() {
            return Ok(None);
        }
        super::read::settings(&self.pins)
            .map(Some)
            .map_err(|e| internal(format!("cannot read the pinned SETTINGS: {e:#}")))
    }
}
