//! The node's primary network, loaded ahead of its first pod. Loading a datapath (creating the
//! flow tables, verifying the programs) is most of a network's first ADD; with the node file
//! naming the primary network and its pod CIDRs, the agent does it at start, and again whenever
//! it finds the datapath gone (the last pod's DEL unloads it), so that the first pod's ADD
//! costs what any other costs. The settings are the ones that ADD computes from the node file
//! (every node-level one comes from it alone, `NodeSubnets`): a configuration of that name that
//! is not the node file's is refused, and only a changed node file makes an ADD load other
//! settings in place of the agent's while no pod uses it (`Datapath::ensure_loaded`). On SIGTERM the agent unloads it again if no pod uses it, so
//! that removing the DaemonSet leaves nothing loaded.
use std::path::Path;

use anyhow::{Context as _, Result};
use ipnetwork::{Ipv4Network, Ipv6Network};
use serde_json::json;

use crate::{
    bpf::{self, Datapath, Pins, Settings},
    cni::{
        config::NetConf,
        node_conf::{Mismatch, NodeConf},
    },
    net::netlink::Netlink,
};

pub struct Preload {
    /// The primary network's configuration as an ADD would see it once confined.
    conf: NetConf,
    pods_v4: Option<Ipv4Network>,
    pods_v6: Option<Ipv6Network>,
}

impl Preload {
    /// The primary network's pins.
    pub fn pins(&self) -> Pins {
        Pins::current(&self.conf.bpffs_root(), &self.conf.name)
    }

    /// What to keep loaded, or None (and why, logged) when the node file at `path` does not say.
    pub fn from_node_file(path: &Path) -> Result<Option<Self>> {
        let node = NodeConf::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(node) = node else {
            log::info!("no node file at {}: no datapath is loaded ahead of the first pod", path.display());
            return Ok(None);
        };
        let (Some(network), Some(_)) = (&node.primary_network, node.pod_cidrs.as_ref().filter(|c| !c.is_empty()))
        else {
            log::info!("the node file names no primaryNetwork and podCIDRs: no datapath is loaded ahead");
            return Ok(None);
        };
        let raw =
            json!({ "cniVersion": "1.0.0", "name": network, "type": "ebpf-cni", "ipam": { "type": "host-local" } });
        let mut conf = NetConf::parse(raw.to_string().as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
        node.confine(path, &mut conf, Mismatch::Refuse).map_err(|e| anyhow::anyhow!("{e}"))?;
        // The subnets an ADD of this network loads with too (`NodeSubnets`).
        let subnets = conf.node_subnets.clone().unwrap_or_else(|| node.primary_subnets(path));
        Ok(Some(Self { conf, pods_v4: subnets.v4, pods_v6: subnets.v6 }))
    }

    /// Loads the datapath unless one is loaded (whatever its settings: an ADD's wins); whether
    /// it loaded it now.
    pub fn ensure(&self) -> Result<bool> {
        self.with_datapath(|datapath, node| async move {
            if datapath.is_loaded() {
                return Ok(false);
            }
            let settings = Settings::resolve(&self.conf, self.pods_v4, self.pods_v6, &node).await?;
            settings.warn_about_node();
            datapath.ensure_loaded(&settings, &node).await?;
            Ok(true)
        })
    }

    /// Runs `work` on the network's locked datapath, on a runtime of its own (the loader
    /// enters a mount namespace of its own on the calling thread for a moment).
    fn with_datapath<F, Fut>(&self, work: F) -> Result<bool>
    where
        F: FnOnce(Datapath, Netlink) -> Fut,
        Fut: std::future::Future<Output = crate::cni::CniResult<bool>>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        runtime.block_on(async {
            let root = self.conf.bpffs_root();
            let describe = |e: crate::cni::CniError| anyhow::anyhow!("network {}: {e}", self.conf.name);
            Datapath::mount_bpffs(&root).map_err(describe)?;
            let datapath = Datapath::lock(&root, &self.conf.name).map_err(describe)?;
            let node = Netlink::connect().context("opening netlink")?;
            work(datapath, node).await.map_err(describe)
        })
    }

    /// [`Self::ensure`], logged.
    pub fn ensure_logged(&self) {
        match self.ensure() {
            Ok(true) => log::info!("loaded network {}'s datapath ahead of its first pod", self.conf.name),
            Ok(false) => {}
            Err(e) => log::error!("cannot load the datapath ahead: {e:#}"),
        }
    }

    /// Counts again what each pod holds through masquerade, sweeps the flows of pods that are
    /// gone and lets pods whose Service flows are gone back onto the fast path
    /// (`bpf::recount_shares`, `bpf::sweep_flows`, `bpf::renew_stack_epochs`): without the
    /// network's lock but for a few writes, so no ADD waits for it. Only the primary network masquerades (the node file says so), so its maps
    /// are the only ones with flows to count.
    pub fn maintain_flows_logged(&self) {
        let pins = Pins::current(&self.conf.bpffs_root(), &self.conf.name);
        if let Err(e) = bpf::recount_shares(&pins) {
            log::warn!("network {}: recounting masquerade shares: {e}", self.conf.name);
        }
        match bpf::sweep_flows(&pins) {
            Ok((0, 0)) => {}
            Ok((nat, flows)) => {
                log::debug!("network {}: swept {nat} NAT and {flows} FLOWS entries of gone pods", self.conf.name)
            }
            Err(e) => log::warn!("network {}: sweeping flows of gone pods: {e}", self.conf.name),
        }
        match bpf::renew_stack_epochs(&self.conf.bpffs_root(), &self.conf.name) {
            Ok(renewed) => log::debug!("network {}: stack epochs: {renewed:?}", self.conf.name),
            Err(e) => log::warn!("network {}: renewing stack epochs: {e}", self.conf.name),
        }
    }

    /// Unloads the datapath if no pod uses it, and ends the agent while still holding the
    /// network's lock: a preload of the interval's thread that waits for it never starts, so
    /// nothing is left half loaded.
    pub fn unload_and_exit(&self) -> ! {
        let name = &self.conf.name;
        let locked = self.with_datapath(|datapath, node| async move {
            match datapath.remove_if_unused(&node).await {
                Ok(true) => log::info!("unloaded network {name}'s datapath: no pod used it"),
                Ok(false) => log::info!("network {name}'s datapath stays: pods use it"),
                Err(e) => log::error!("cannot unload network {name}'s datapath: {e}"),
            }
            std::process::exit(0)
        });
        if let Err(e) = locked {
            log::error!("cannot unload the datapath: {e:#}");
        }
        std::process::exit(0)
    }
}
