//! DEL: remove everything of one attachment. Idempotent: a second DEL, a DEL for a container we
//! never saw and a DEL whose netns is already gone all succeed. Also the rollback of a failed ADD.
use crate::{
    attachment::Attachment,
    bpf::Datapath,
    cni::{CniResult, Context, ErrorCode, config::NetConf, env::CniEnv},
    ipam::Ipam,
    net::netlink::Netlink,
};

pub async fn del(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<()> {
    let ipam = Ipam::from_conf(conf, raw_conf)?;
    let node = Netlink::connect().cni(ErrorCode::IO, "cannot open netlink")?;
    teardown(env, conf, &ipam, &node).await
}

/// Datapath first (so no packet is steered to a veth being deleted), then the veth (which takes
/// the pod end and the host route with it), then the addresses. Keeps going past a failed step
/// and reports the first failure.
pub async fn teardown(env: &CniEnv, conf: &NetConf, ipam: &Ipam, node: &Netlink) -> CniResult<()> {
    let attachment = Attachment::new(&env.container_id, &env.ifname);
    let mut first_err = None;
    let root = conf.bpffs_root();
    if root.exists() {
        let datapath = Datapath::lock(&root, &conf.name);
        let steps = datapath.and_then(|dp| {
            dp.detach(&env.container_id, &env.ifname)?;
            dp.remove_endpoints(attachment.cookie())?;
            dp.remove_if_unused().map(drop)
        });
        first_err = steps.err();
    }
    if let Err(e) = node.delete_link(&attachment.host_ifname()).await.cni(ErrorCode::IO, "cannot delete host veth") {
        first_err.get_or_insert(e);
    }
    if let Err(e) = ipam.release(env) {
        first_err.get_or_insert(e);
    }
    first_err.map_or(Ok(()), Err)
}
