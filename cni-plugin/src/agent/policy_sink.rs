//! The compiler's output into the primary network's maps, for the agent and `policy-set`
//! alike. The maps come and go with the datapath (the last pod's DEL unloads it, the agent loads
//! it again, empty): whenever the pins are new the sink reads what they hold and writes the
//! difference, after that only what changed between two compiles.
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use ebpf_common::names;

use crate::{
    bpf::{
        Pins,
        policy_maps::{Applied, PolicyMaps, reset_counts},
    },
    policy::{Changes, Compiled},
};

pub struct PolicySink {
    root: PathBuf,
    network: String,
    /// The network's pins as last found: the layout loaded may change (an upgrade's reload).
    pins: Pins,
    /// The open maps, with the inode of the `POLICY_RULES` pin.
    maps: Option<(PolicyMaps, u64)>,
    /// What the maps hold, as far as this sink knows.
    written: Compiled,
    /// Said once per load without FEATURE_POLICY.
    told_off: bool,
}

/// One write's outcome.
pub enum Written {
    /// The programs do not enforce policy (no FEATURE_POLICY, or nothing loaded): nothing written.
    NotEnforced,
    Applied {
        changes: usize,
        applied: Applied,
        took: std::time::Duration,
    },
}

impl PolicySink {
    pub fn new(root: &Path, network: &str) -> Self {
        let (root, network, pins) = (root.to_path_buf(), network.to_string(), Pins::current(root, network));
        Self { root, network, pins, maps: None, written: Compiled::default(), told_off: false }
    }

    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    fn pinned_inode(&self) -> Option<u64> {
        std::fs::metadata(self.pins.map(names::POLICY_RULES)).ok().map(|m| m.ino())
    }

    /// Opens the maps when they are new (reading what they hold); false when there are none to
    /// write (said once).
    fn open(&mut self) -> bool {
        let inode = self.pinned_inode();
        if self.maps.as_ref().map(|(_, at)| Some(*at)) == Some(inode) {
            return true;
        }
        self.maps = None;
        self.pins = Pins::current(&self.root, &self.network);
        let opened = match PolicyMaps::open(&self.pins) {
            Ok(Some(maps)) => maps.contents().map(|held| (maps, held)),
            Ok(None) => {
                if !std::mem::replace(&mut self.told_off, true) {
                    log::warn!(
                        "network policy: the datapath at {} was loaded without FEATURE_POLICY (or is not loaded): \
                         nothing is enforced until it is reloaded",
                        self.pins.version_dir().display()
                    );
                }
                return false;
            }
            Err(e) => Err(e),
        };
        match (opened, inode) {
            (Ok((maps, held)), Some(inode)) => {
                log::info!(
                    "network policy: maps opened, holding {} rules, {} identities",
                    held.rules.len(),
                    held.identities.len()
                );
                self.written = held;
                self.maps = Some((maps, inode));
                self.told_off = false;
                true
            }
            (Ok(_), None) => false,
            (Err(e), _) => {
                log::error!("network policy: the maps cannot be opened: {e:#}");
                false
            }
        }
    }

    /// Writes `desired` (the difference from what the maps hold); new policies' counts zeroed.
    pub fn write(&mut self, desired: &Compiled, new_slots: &[u32]) -> Written {
        let started = Instant::now();
        if !self.open() {
            return Written::NotEnforced;
        }
        let Some((maps, _)) = &mut self.maps else { return Written::NotEnforced };
        if let Err(e) = reset_counts(&self.pins, new_slots) {
            log::warn!("network policy: zeroing the counts of new policies: {e:#}");
        }
        let changes = Changes::between(&self.written, desired);
        let applied = maps.apply(&changes);
        if applied.failed > 0 {
            log::error!(
                "network policy: {} of {} map writes failed (first: {}); the maps are read again next time",
                applied.failed,
                changes.len(),
                applied.first_error.as_deref().unwrap_or("?")
            );
            self.maps = None;
        }
        self.written = desired.clone();
        Written::Applied { changes: changes.len(), applied, took: started.elapsed() }
    }

    /// Whether the maps were replaced (a datapath loaded again, maybe of another layout) since
    /// the last write.
    pub fn stale(&self) -> bool {
        let now = Pins::current(&self.root, &self.network);
        now.version() != self.pins.version() || self.maps.as_ref().map(|(_, at)| *at) != self.pinned_inode()
    }
}
