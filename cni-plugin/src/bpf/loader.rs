//! First ADD of a network: load the object with the network's settings, pin maps and programs,
//! and attach the uplink programs when the network masquerades. Later ADDs find the pins and
//! only check that they were loaded with the same settings.
use std::{fs, os::unix::fs::DirBuilderExt as _};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData},
    programs::{SchedClassifier, TcAttachType},
};
use ebpf_common::{DatapathConfig, names};

use super::{
    datapath::{Datapath, attach_pinned, internal},
    kernel_btf,
    settings::{Describe, Settings},
};
use crate::cni::{CniError, CniResult, Context, ErrorCode};

/// The TC object built from `ebpf/`, with BTF, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ebpf-cni"));

const MAPS: [&str; 4] = [names::ENDPOINTS, names::METRICS, names::NAT, names::SETTINGS];

impl Datapath {
    /// Loads and pins the programs and maps unless an earlier ADD already did.
    pub fn ensure_loaded(&self, settings: &Settings) -> CniResult<()> {
        if self.is_loaded() {
            return self.check_settings(&settings.config);
        }
        self.refuse_other_layouts()?;
        // A load interrupted before the last pin leaves some pins behind: start over.
        for dir in ["maps", "progs", "uplink"] {
            let _ = fs::remove_dir_all(self.pins.version_dir().join(dir));
        }
        for dir in ["maps", "progs", "uplink"] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.pins.version_dir().join(dir))
                .cni(ErrorCode::DATAPATH, "cannot create pin directories")?;
        }
        let mut loader = {
            let _hidden = kernel_btf::Hidden::unless_needed(OBJECT);
            EbpfLoader::new()
        };
        let mut ebpf = loader
            .override_global(names::CONFIG, &settings.config, true)
            .override_global(aya_log::LEVEL, &settings.log_level, true)
            .load(OBJECT)
            .cni(ErrorCode::DATAPATH, "kernel refused the eBPF object")?;
        for name in MAPS {
            let map = ebpf.map(name).ok_or_else(|| internal(format!("object has no map {name}")))?;
            map.pin(self.pins.map(name)).cni(ErrorCode::DATAPATH, format!("cannot pin map {name}"))?;
        }
        crate::fault::point("add:mid-load");
        let mut recorded: Array<_, DatapathConfig> = Array::try_from(ebpf.map_mut(names::SETTINGS).expect("pinned"))
            .cni(ErrorCode::INTERNAL, "SETTINGS has another layout")?;
        recorded.set(0, settings.config, 0).cni(ErrorCode::DATAPATH, "cannot record the settings")?;
        for name in [names::TO_UPLINK, names::FROM_UPLINK, names::FROM_POD] {
            classifier(&mut ebpf, name)?.load().cni(ErrorCode::DATAPATH, format!("verifier rejected {name}"))?;
        }
        if let Some(uplink) = &settings.uplink {
            self.attach_uplink(&mut ebpf, uplink)?;
        }
        // The program that pods attach to is pinned last: its pin means everything is there.
        for name in [names::TO_UPLINK, names::FROM_UPLINK, names::FROM_POD] {
            classifier(&mut ebpf, name)?
                .pin(self.pins.program(name))
                .cni(ErrorCode::DATAPATH, format!("cannot pin {name}"))?;
        }
        Ok(())
    }

    /// Pins of another layout version belong to pods of another ebpf-cni build: their programs
    /// read maps we cannot share, so pods of both would not reach each other. The first load is
    /// refused until an operator has moved those pods (or removed the directory); checked only
    /// then, so later ADDs pay nothing for it.
    fn refuse_other_layouts(&self) -> CniResult<()> {
        let Ok(entries) = fs::read_dir(self.pins.network_dir()) else { return Ok(()) };
        let ours = self.pins.version_dir().file_name();
        for entry in entries.flatten() {
            if Some(entry.file_name().as_os_str()) != ours {
                return Err(CniError::new(
                    ErrorCode::DATAPATH,
                    format!("{} holds pins of another ebpf-cni layout", entry.path().display()),
                )
                .with_details(format!(
                    "this build pins layout v{}; delete the pods created by the other build (or remove \
                     that directory once none is left), then retry",
                    ebpf_common::PIN_LAYOUT_VERSION
                )));
            }
        }
        Ok(())
    }

    /// TCX egress (masquerade) and ingress (replies) of the uplink, each link pinned; they go
    /// with the rest of the network's pins. Both at once: each TCX attach waits for an RCU
    /// grace period (8–15 ms here), and two threads wait for theirs together.
    fn attach_uplink(&self, ebpf: &mut Ebpf, uplink: &str) -> CniResult<()> {
        let (mut egress, mut ingress) = (None, None);
        for (name, program) in ebpf.programs_mut() {
            let slot = match name {
                names::TO_UPLINK => &mut egress,
                names::FROM_UPLINK => &mut ingress,
                _ => continue,
            };
            *slot = Some(<&mut SchedClassifier>::try_from(program).cni(ErrorCode::INTERNAL, "not a classifier")?);
        }
        let missing = || internal("object lacks an uplink program");
        let (egress, ingress) = (egress.ok_or_else(missing)?, ingress.ok_or_else(missing)?);
        let (egress_pin, ingress_pin) =
            (self.pins.uplink_link(names::TO_UPLINK), self.pins.uplink_link(names::FROM_UPLINK));
        std::thread::scope(|s| {
            let out = s.spawn(|| attach_pinned(egress, uplink, TcAttachType::Egress, &egress_pin));
            let back = attach_pinned(ingress, uplink, TcAttachType::Ingress, &ingress_pin);
            out.join().unwrap_or_else(|_| Err(internal("attaching to_uplink panicked"))).and(back)
        })
    }

    /// Settings are fixed while the network has pods: a different configuration is refused
    /// rather than silently ignored.
    fn check_settings(&self, wanted: &DatapathConfig) -> CniResult<()> {
        let path = self.pins.map(names::SETTINGS);
        let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, "cannot open pinned SETTINGS")?;
        let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned SETTINGS")?;
        let map: Array<_, DatapathConfig> =
            Array::try_from(map).cni(ErrorCode::DATAPATH, "pinned SETTINGS has another layout")?;
        let loaded = map.get(&0, 0).cni(ErrorCode::DATAPATH, "cannot read SETTINGS")?;
        if loaded == *wanted {
            return Ok(());
        }
        Err(CniError::new(
            ErrorCode::INVALID_CONFIG,
            format!("this network's datapath runs with other settings: {}", Describe(&loaded)),
        )
        .with_details(format!(
            "the configuration asks for {}; settings change once the network's last pod is deleted",
            Describe(wanted)
        )))
    }
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> CniResult<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or_else(|| internal(format!("object has no program {name}")))?
        .try_into()
        .cni(ErrorCode::INTERNAL, format!("{name} is not a classifier"))
}
