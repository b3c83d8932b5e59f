//! The names file for `ebpf-cni monitor` (`/run/ebpf-cni/policy-names.json`): which policy a
//! counter slot is, what an identity is, whose an address is. Written aside and renamed into
//! place, so the monitor never reads half a file.
use std::{collections::BTreeMap, path::Path};

use ebpf_common::{IDENTITY_HOST, IDENTITY_WORLD};
use serde::Serialize;

use super::{identities::Table, input::Input, selector::Labels, slots::Slots};

/// Where the agent writes it unless `--policy-names` says otherwise.
pub const DEFAULT_PATH: &str = "/run/ebpf-cni/policy-names.json";

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Names {
    /// Slot → `namespace/name`.
    pub policies: BTreeMap<String, String>,
    pub identities: BTreeMap<String, IdentityName>,
    /// Pod address → `namespace/name`.
    pub pods: BTreeMap<String, String>,
}

/// An identity as the monitor shows it: a pod identity's namespace and labels; none for the
/// node, the world and `ipBlock` regions (`namespace` is then `""`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IdentityName {
    pub namespace: String,
    pub labels: Labels,
}

impl Names {
    pub fn new(input: &Input, table: &Table, slots: &Slots) -> Self {
        let policies = slots.iter().map(|((ns, name), slot)| (slot.to_string(), format!("{ns}/{name}"))).collect();
        let mut identities: BTreeMap<String, IdentityName> = table
            .known
            .iter()
            .map(|k| {
                let (namespace, labels) =
                    k.pod.as_ref().map(|p| (p.namespace.clone(), p.labels.clone())).unwrap_or_default();
                (k.id.to_string(), IdentityName { namespace, labels })
            })
            .collect();
        for (id, what) in [(IDENTITY_HOST, "host"), (IDENTITY_WORLD, "world")] {
            let labels = Labels::from([("reserved".to_string(), what.to_string())]);
            identities.insert(id.to_string(), IdentityName { namespace: String::new(), labels });
        }
        let pods = table
            .pods
            .iter()
            .flat_map(|((ns, name), ips)| ips.iter().map(move |(ip, _)| (ip.to_string(), format!("{ns}/{name}"))))
            .collect();
        let _ = input;
        Self { policies, identities, pods }
    }

    /// Writes the file aside and renames it into place (its directory made if missing).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let aside = path.with_extension("json.tmp");
        std::fs::write(&aside, serde_json::to_vec(self)?)?;
        std::fs::rename(&aside, path)
    }
}
