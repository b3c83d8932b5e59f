//! Where a network's objects live in bpffs:
//! `<root>/<network>/v<N>/{progs,maps}/…`, `N` being the pinned layout version, so a
//! plugin upgrade with a new map layout never opens pins of the old one as its own.
//!
//! An upgrade while pods run: a network whose datapath the previous layout loaded keeps it (this
//! build attaches new pods to the pinned programs of that layout) until its last pod is gone;
//! the next ADD then loads this build's.
use std::path::{Path, PathBuf};

use ebpf_common::{PIN_LAYOUT_VERSION, names};

/// The layout before this build's (releases 5b4a135 and 52899e9). Its `SETTINGS` is the same
/// struct; `FRAGMENTS`, whose value grew, the plugin never opens; `Endpoint` has the same size,
/// its stack bytes (v3: `stack_replies`, `stack_peers`) written zero by the plugin either way.
/// So this build adds and removes its pods' entries in v3's maps. Maps newer than v3 are absent
/// from its pins, as `FEATURES` is from 5b4a135's.
pub const PREVIOUS_LAYOUT_VERSION: u32 = 3;

#[derive(Clone)]
pub struct Pins {
    network_dir: PathBuf,
    version_dir: PathBuf,
    version: u32,
}

impl Pins {
    /// This build's layout.
    pub fn new(root: &Path, network: &str) -> Self {
        Self::with_version(root, network, PIN_LAYOUT_VERSION)
    }

    pub fn with_version(root: &Path, network: &str, version: u32) -> Self {
        let network_dir = root.join(network);
        let version_dir = network_dir.join(format!("v{version}"));
        Self { network_dir, version_dir, version }
    }

    /// The layout `network` runs: this build's once loaded, else the previous one's while it is
    /// loaded, else this build's (to be loaded).
    pub fn current(root: &Path, network: &str) -> Self {
        let own = Self::new(root, network);
        if own.program(names::FROM_POD).exists() {
            return own;
        }
        let previous = Self::with_version(root, network, PREVIOUS_LAYOUT_VERSION);
        if previous.program(names::FROM_POD).exists() { previous } else { own }
    }

    /// The same network's pins of layout `version`.
    pub fn other_version(&self, version: u32) -> Self {
        let version_dir = self.network_dir.join(format!("v{version}"));
        Self { network_dir: self.network_dir.clone(), version_dir, version }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Whether these are the previous layout's pins, loaded by an older build.
    pub fn is_previous(&self) -> bool {
        self.version != PIN_LAYOUT_VERSION
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

    /// A pinned link (the socket LB's cgroup attachments): the attachment lasts while the pin
    /// does, so removing the version directory detaches it.
    pub fn link(&self, name: &str) -> PathBuf {
        self.version_dir.join("links").join(name)
    }

    /// An empty directory, present when this network added the uplink's clsact qdisc: only
    /// then does the network remove the qdisc again (bpffs holds no plain files).
    pub fn clsact_mark(&self) -> PathBuf {
        self.version_dir.join("uplink-clsact")
    }
}
