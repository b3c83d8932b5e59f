//! The socket LB's cgroup `sock_addr` programs (`ebpf/src/service/`), attached at the node
//! file's `cgroupRoot` when it sets `kubeProxyReplacement`. Loaded and attached once, with the
//! network's datapath, by whoever loads it (the agent ahead of the first pod, or the first ADD);
//! later ADDs find them attached.
//!
//! A cgroup attachment made with `BPF_LINK_CREATE` lasts while its link has a reference, so
//! each link is pinned under the version directory (`links/<program>`): it outlives the loading
//! process, and the last DEL (or GC) detaches it by removing that directory with the rest of
//! the network's pins. A link attachment is always one of several (the kernel refuses
//! `BPF_F_ALLOW_MULTI` with a link, so the mode passed is the default): another tool's programs
//! on the same cgroup keep running.
use std::{fs::File, path::Path};

use aya::{
    Ebpf,
    programs::{CgroupAttachMode, CgroupSockAddr, links::FdLink},
};
use ebpf_common::names;

use super::{datapath::internal, pins::Pins};
use crate::cni::{CniResult, Context, ErrorCode};

pub fn attach(ebpf: &mut Ebpf, pins: &Pins, cgroup: &Path) -> CniResult<()> {
    let cgroup_dir = File::open(cgroup)
        .cni(ErrorCode::DATAPATH, format!("cannot open cgroup {} for the socket LB (cgroupRoot)", cgroup.display()))?;
    for name in names::SOCKET_LB {
        let program: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or_else(|| internal(format!("object has no program {name}")))?
            .try_into()
            .cni(ErrorCode::INTERNAL, format!("{name} is not a sock_addr program"))?;
        program.load().cni(ErrorCode::DATAPATH, format!("verifier rejected {name}"))?;
        let id = program
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .cni(ErrorCode::DATAPATH, format!("cannot attach {name} to {}", cgroup.display()))?;
        let link = program.take_link(id).cni(ErrorCode::INTERNAL, "attached link vanished")?;
        let link = FdLink::try_from(link).cni(
            ErrorCode::DATAPATH,
            "the kernel attached the socket LB without a link (BPF_LINK_CREATE is needed to pin it)",
        )?;
        link.pin(pins.link(name)).cni(ErrorCode::DATAPATH, format!("cannot pin the link of {name}"))?;
    }
    Ok(())
}
