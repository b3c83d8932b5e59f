//! Where a network's objects live in bpffs:
//! `<root>/<network>/v<N>/{progs,maps,links,uplink}/…`, `N` being the pinned layout version, so a
//! plugin upgrade with a new map layout never opens pins of the old one.
use std::path::{Path, PathBuf};

use ebpf_common::PIN_LAYOUT_VERSION;

pub struct Pins {
    network_dir: PathBuf,
    version_dir: PathBuf,
}

impl Pins {
    pub fn new(root: &Path, network: &str) -> Self {
        let network_dir = root.join(network);
        let version_dir = network_dir.join(format!("v{PIN_LAYOUT_VERSION}"));
        Self { network_dir, version_dir }
    }

    pub fn network_dir(&self) -> &Path {
        &self.network_dir
    }

    pub fn version_dir(&self) -> &Path {
        &self.version_dir
    }

    pub fn program(&self, name: &str) -> PathBuf {
        self.version_dir.join("progs").join(name)
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.version_dir.join("maps").join(name)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.version_dir.join("links")
    }

    /// One TCX link per attachment; its name is unique because container ID + ifname are.
    pub fn link(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.links_dir().join(link_name(container_id, ifname))
    }
}

impl Pins {
    /// The uplink's TCX links, one per program, shared by all pods of the network.
    pub fn uplink_link(&self, program: &str) -> PathBuf {
        self.version_dir.join("uplink").join(program)
    }
}

/// The file name of an attachment's link pin.
pub fn link_name(container_id: &str, ifname: &str) -> String {
    format!("{container_id}-{ifname}")
}
