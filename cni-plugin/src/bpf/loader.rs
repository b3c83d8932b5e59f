//! First ADD of a network: load the object with the network's settings, pin maps and programs,
//! and attach the uplink programs when the network masquerades (`uplink.rs`). Later ADDs find
//! the pins and only check that they were loaded with the same settings.
use std::{fs, os::unix::fs::DirBuilderExt as _};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, ProgramArray},
    programs::SchedClassifier,
};
use ebpf_common::{DatapathConfig, names};

use super::{
    datapath::{Datapath, internal},
    kernel_btf, maps_ahead,
    settings::{Describe, Settings, comparable},
    socket_lb, uplink,
};
use crate::{
    cni::{CniError, CniResult, Context, ErrorCode},
    net::netlink::Netlink,
};

/// The TC object built from `ebpf/`, with BTF, embedded at build time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ebpf-cni"));

/// Whether `OBJECT` has CO-RE relocations, which need the kernel's BTF. Known when it is built
/// (a unit test parses it), so a first ADD does not parse the object one more time to find out.
const OBJECT_NEEDS_KERNEL_BTF: bool = false;

/// The programs by the verifier's time, longest first (a first ADD on this machine, kernel
/// 6.18, with the policy checks as BPF global functions and no byte-loop `memset`/`memmove`
/// calls: `to_uplink` 15,166 instructions processed, `from_pod` 11,814, `from_uplink` 7,726,
/// `to_pod` 5,677; the IPv6 uplink programs between). Verification starts in this order, so
/// that the longest is not left to start last on a node of few CPUs (on two, `to_uplink` then
/// `to_pod` on one thread, `from_uplink` then `from_pod` on the other: about even).
const VERIFY_ORDER: [&str; 12] = [
    names::TO_UPLINK,
    names::TO_UPLINK6,
    names::SVC_FROM_UPLINK6,
    names::SVC_FROM_UPLINK,
    names::FROM_UPLINK,
    names::FROM_UPLINK6,
    names::FROM_POD,
    names::SVC_TO_UPLINK6,
    names::SVC_TO_UPLINK,
    names::SVC_REJECT6,
    names::SVC_REJECT,
    names::TO_POD,
];

/// Size of the Service LB's LRU maps on a network without it: a few pages each.
const UNUSED_LRU_ENTRIES: u32 = 256;

const MAPS: [&str; 31] = [
    names::ENDPOINTS,
    names::METRICS,
    names::FORWARDED,
    names::NAT,
    names::FRAGMENTS,
    names::POD_FLOWS,
    names::FLOWS,
    names::SETTINGS,
    names::FEATURES,
    names::NAT_SHARES,
    names::STACK_EPOCH,
    names::HOST_VETHS,
    names::NODE_ECHOES,
    names::SVC_FRONTENDS,
    names::SVC_BACKENDS,
    names::SVC_AFFINITY,
    names::SVC_SOCKETS,
    names::SVC_COUNTERS,
    names::SVC_CT,
    names::SVC_CLIENTS,
    names::SVC_REJECTS,
    names::SVC_REJECT_PROGS,
    names::POLICY_IDENTITIES,
    names::POLICY_ENDPOINTS,
    names::POLICY_ENDPOINTS_BY_IFINDEX,
    names::POLICY_RULES,
    names::POLICY_FLOWS,
    names::POLICY_COUNTS,
    // `ebpf-cni monitor`'s (new in layout v4's second release: 9ad4fe6's pins lack them).
    names::MONITOR_EVENTS,
    names::MONITOR_CONTROL,
    names::MONITOR_BUDGET,
];

impl Datapath {
    /// Loads and pins the programs and maps unless an earlier ADD already did.
    pub async fn ensure_loaded(&self, settings: &Settings, node: &Netlink) -> CniResult<()> {
        if self.is_loaded() {
            let Err(refused) = self.check_settings(&settings.config) else { return Ok(()) };
            // Loaded ahead of any pod (by the agent, or left by a pod's ADD that failed later)
            // with settings this network's configuration does not have: with no pod to serve,
            // the configuration wins, and this ADD is the network's first. For the node file's
            // primary network the ADD's settings are the node file's alone (a configuration of
            // its name that is not the node file's was refused before it got here), so this
            // only ever loads what the node file says, after the node file changed. Not the
            // previous release's: these pins are its directory, which this build's must not
            // take over.
            if self.pins.is_previous() || !self.remove_if_unused(node).await? {
                return Err(refused);
            }
            log::info!("no pod used the datapath loaded with other settings: loading it again with this ADD's");
        }
        // A last DEL of the previous layout killed midway leaves its directory without the
        // mark of a complete load: finished here, or the check below would refuse for ever.
        self.finish_interrupted_unload(node).await?;
        self.refuse_other_layouts()?;
        // A load interrupted before the last pin leaves some pins behind, and maybe filters on
        // the uplink running its programs: start over.
        self.detach_uplink(node).await?;
        for dir in ["maps", "progs", "links"] {
            let _ = fs::remove_dir_all(self.pins.version_dir().join(dir));
        }
        for dir in ["maps", "progs", "links"] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(self.pins.version_dir().join(dir))
                .cni(ErrorCode::DATAPATH, "cannot create pin directories")?;
        }
        let started = std::time::Instant::now();
        let mut entries: Vec<(&str, u32)> = settings.map_entries.clone();
        // Without the Service LB nothing uses its preallocated LRU maps (about 27 MiB at their
        // sizes): every node would pay for them. They are pinned all the same, as the layout's.
        if settings.socket_lb.is_none() {
            for map in [names::SVC_CT, names::SVC_CLIENTS, names::SVC_AFFINITY, names::SVC_SOCKETS] {
                entries.push((map, UNUSED_LRU_ENTRIES));
            }
        }
        let ahead = maps_ahead::create(OBJECT, &entries, &self.pins)?;
        let ahead_made = started.elapsed();
        let mut loader = {
            let _hidden = kernel_btf::Hidden::unless_needed(OBJECT_NEEDS_KERNEL_BTF);
            EbpfLoader::new()
        };
        for &(map, count) in &entries {
            loader.map_max_entries(map, count);
        }
        for &name in &ahead {
            loader.map_pin_path(name, self.pins.map(name));
        }
        let mut ebpf = loader
            .override_global(names::CONFIG, &settings.config, true)
            .override_global(aya_log::LEVEL, &settings.log_level, true)
            .load(OBJECT)
            .cni(ErrorCode::DATAPATH, "kernel refused the eBPF object")?;
        let maps_made = started.elapsed();
        for name in MAPS.into_iter().filter(|name| !ahead.contains(name)) {
            let map = ebpf.map(name).ok_or_else(|| internal(format!("object has no map {name}")))?;
            map.pin(self.pins.map(name)).cni(ErrorCode::DATAPATH, format!("cannot pin map {name}"))?;
        }
        crate::fault::point("add:mid-load");
        let mut recorded: Array<_, DatapathConfig> = Array::try_from(ebpf.map_mut(names::SETTINGS).expect("pinned"))
            .cni(ErrorCode::INTERNAL, "SETTINGS has another layout")?;
        recorded.set(0, settings.config, 0).cni(ErrorCode::DATAPATH, "cannot record the settings")?;
        let mut features: Array<_, u64> = Array::try_from(ebpf.map_mut(names::FEATURES).expect("pinned"))
            .cni(ErrorCode::INTERNAL, "FEATURES has another layout")?;
        features
            .set(
                0,
                ebpf_common::FEATURE_OWNER_CHECKS
                    | ebpf_common::FEATURE_EGRESS_SHAPING
                    | ebpf_common::FEATURE_STACK_EPOCHS
                    | ebpf_common::FEATURE_HOST_VETHS
                    | ebpf_common::FEATURE_POLICY,
                0,
            )
            .cni(ErrorCode::DATAPATH, "cannot record the features")?;
        // The uplink's clsact before the verifier runs, its filters after (`add_clsact`). Once
        // SETTINGS is recorded: a load that fails from here on finds it again to remove it.
        if let Some(uplink) = &settings.uplink
            && super::datapath::add_clsact(uplink)?
        {
            self.mark_clsact_ours()?;
        }
        // Only the programs the network attaches: the verifier's time is most of a first ADD,
        // and a network without masquerade, or without IPv6, never runs the uplink's (IPv6) ones.
        let uplink_programs = if settings.uplink.is_some() { uplink::programs_for(&settings.config) } else { &[] };
        // Per-packet Service translation on the uplink: with kubeProxyReplacement, and only
        // where there is an uplink (masquerade names it and the node's address).
        let service_programs = if settings.uplink.is_some() && settings.socket_lb.is_some() {
            uplink::service_programs_for(&settings.config)
        } else {
            &[]
        };
        // The no-endpoint answers, one per family the Service programs serve (never attached).
        let rejects = &[names::SVC_REJECT, names::SVC_REJECT6][..service_programs.len() / 2];
        let wanted: Vec<&str> = uplink_programs
            .iter()
            .chain(service_programs)
            .map(|&(name, _)| name)
            .chain([names::TO_POD, names::FROM_POD])
            .collect();
        let before_verifier = started.elapsed();
        verify_concurrently(&mut ebpf, &[&wanted[..], rejects].concat())?;
        let verified = started.elapsed();
        if !rejects.is_empty() {
            fill_reject_slots(&mut ebpf, rejects)?;
        }
        // Pinned before they are attached, so that a restarted load finds their filters.
        for &name in wanted.iter().filter(|&&name| name != names::FROM_POD) {
            classifier(&mut ebpf, name)?
                .pin(self.pins.program(name))
                .cni(ErrorCode::DATAPATH, format!("cannot pin {name}"))?;
        }
        if let Some(uplink) = &settings.uplink {
            // The Service programs last: a filter added without a priority goes before those
            // there, so they see the uplink's packets first and pass the rest on.
            for &(name, direction) in uplink_programs.iter().chain(service_programs) {
                if uplink::attach(classifier(&mut ebpf, name)?, uplink, direction)? {
                    self.mark_clsact_ours()?;
                }
            }
            crate::fault::point("add:after-uplink");
        }
        if let Some(cgroup) = &settings.socket_lb {
            socket_lb::attach(&mut ebpf, &self.pins, cgroup)?;
        }
        // The program that pods attach to is pinned last: its pin means everything is there.
        classifier(&mut ebpf, names::FROM_POD)?
            .pin(self.pins.program(names::FROM_POD))
            .cni(ErrorCode::DATAPATH, format!("cannot pin {}", names::FROM_POD))?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        log::debug!(
            "loaded in {:.1} ms: object and maps {:.1} (the largest maps ahead {:.1}), pins and settings {:.1}, \
             verifier {:.1} ({} programs), pins and attachments {:.1}",
            ms(started.elapsed()),
            ms(maps_made),
            ms(ahead_made),
            ms(before_verifier - maps_made),
            ms(verified - before_verifier),
            wanted.len() + rejects.len(),
            ms(started.elapsed() - verified),
        );
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

    /// Settings are fixed while the network has pods: a different configuration is refused
    /// rather than silently ignored.
    fn check_settings(&self, wanted: &DatapathConfig) -> CniResult<()> {
        let loaded = self.recorded_settings()?.ok_or_else(|| internal("SETTINGS is not pinned"))?;
        // The previous layout's settings are this build's struct, resolved from a configuration
        // the same way: compared whole, as this build's own.
        if comparable(&loaded) == comparable(wanted) {
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

/// Loads the named programs on as many threads as the node has CPUs, longest first
/// (`VERIFY_ORDER`): the kernel verifies root's programs in parallel, and on a node of two CPUs
/// that makes the verifier's share of a first ADD the longest program's, about, instead of
/// their sum.
fn verify_concurrently(ebpf: &mut Ebpf, names: &[&str]) -> CniResult<()> {
    let mut programs: Vec<(&str, &mut SchedClassifier)> = Vec::new();
    for (name, program) in ebpf.programs_mut().filter(|(name, _)| names.contains(name)) {
        let classifier = program.try_into().cni(ErrorCode::INTERNAL, format!("{name} is not a classifier"))?;
        programs.push((name, classifier));
    }
    if programs.len() != names.len() {
        return Err(internal(format!("the object lacks one of the programs {names:?}")));
    }
    // Popped from the end: the longest last in the vector.
    programs.sort_by_key(|(name, _)| std::cmp::Reverse(VERIFY_ORDER.iter().position(|n| n == name)));
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(programs.len());
    let queue = std::sync::Mutex::new(programs);
    let next = || queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
    std::thread::scope(|scope| {
        let loads: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    while let Some((name, program)) = next() {
                        let started = std::time::Instant::now();
                        program.load().cni(ErrorCode::DATAPATH, format!("verifier rejected {name}"))?;
                        log::debug!("{name} verified in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
                    }
                    Ok(())
                })
            })
            .collect();
        loads.into_iter().try_for_each(|load| load.join().unwrap_or_else(|_| Err(internal("a program load panicked"))))
    })
}

/// Puts the answering programs into `SVC_REJECT_PROGS` (slot 0 IPv4, 1 IPv6). The map is
/// pinned: a program array loses its entries once no file descriptor or pin refers to it.
fn fill_reject_slots(ebpf: &mut Ebpf, rejects: &[&str]) -> CniResult<()> {
    let map = ebpf.take_map(names::SVC_REJECT_PROGS).ok_or_else(|| internal("object has no SVC_REJECT_PROGS"))?;
    let mut slots = ProgramArray::try_from(map).cni(ErrorCode::INTERNAL, "SVC_REJECT_PROGS is no program array")?;
    for (slot, name) in rejects.iter().enumerate() {
        let fd = classifier(ebpf, name)?.fd().cni(ErrorCode::INTERNAL, format!("{name} is not loaded"))?;
        slots.set(slot as u32, fd, 0).cni(ErrorCode::DATAPATH, format!("cannot put {name} into SVC_REJECT_PROGS"))?;
    }
    Ok(())
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> CniResult<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or_else(|| internal(format!("object has no program {name}")))?
        .try_into()
        .cni(ErrorCode::INTERNAL, format!("{name} is not a classifier"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_needs_kernel_btf_only_as_recorded() {
        let object = aya_obj::Object::parse(OBJECT).unwrap();
        assert_eq!(
            object.has_btf_relocations(),
            OBJECT_NEEDS_KERNEL_BTF,
            "the object's CO-RE relocations changed: update OBJECT_NEEDS_KERNEL_BTF"
        );
    }

    #[test]
    fn the_maps_created_ahead_are_the_objects_and_pinned() {
        let object = aya_obj::Object::parse(OBJECT).unwrap();
        for name in maps_ahead::AHEAD {
            assert!(object.maps.contains_key(name), "the object has no map {name}");
            assert!(MAPS.contains(&name), "{name} is created ahead but not one of the pinned MAPS");
        }
    }

    #[test]
    fn every_program_has_its_place_in_the_verify_order() {
        let object = aya_obj::Object::parse(OBJECT).unwrap();
        // The socket LB's are attached elsewhere; the benchmarks' floor is never loaded here.
        let elsewhere = |name: &str| names::SOCKET_LB.contains(&name) || name == names::FLOOR;
        for name in object.programs.keys().filter(|name| !elsewhere(name)) {
            assert!(VERIFY_ORDER.contains(&name.as_str()), "{name} is not in VERIFY_ORDER");
        }
    }
}
