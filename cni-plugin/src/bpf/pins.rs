//! Where a network's objects live in bpffs:
//! `<root>/<network>/v<N>/{progs,maps}/…`, `N` being the pinned layout version, so a
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
}

impl Pins {
    /// An empty directory, present when this network added the uplink's clsact qdisc: only
    /// then does the network remove the qdisc again (bpffs holds no plain files).
    pub fn clsact_mark(&self) -> PathBuf {
        self.version_dir.join("uplink-clsact")
    }
}
