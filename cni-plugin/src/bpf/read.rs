//! Reading a network's pins as they are, for `inspect` and `metrics`: nothing here changes,
//! resets or consumes anything, nor takes the root's lock (a scrape never waits for an ADD).
use std::{
    fs,
    io::ErrorKind,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
    programs::ProgramInfo,
};
use ebpf_common::{
    Affinity, AffinityKey, Counter, DatapathConfig, DropReason, Endpoint, ForwardPath, IpKey, Service, ServiceEvent,
    ServiceKey, names,
};

use super::Pins;

/// The networks under `root`, sorted: one directory each. An error when the root cannot be read
/// (missing, or not root), saying which.
pub fn networks(root: &Path) -> Result<Vec<String>> {
    let entries = fs::read_dir(root).with_context(|| match fs::metadata(root) {
        Err(e) if e.kind() == ErrorKind::NotFound => format!("reading {} (is a pod running?)", root.display()),
        _ => format!("reading {} (run as root)", root.display()),
    })?;
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// The pins of `network`, once they are known to be there.
pub fn pinned(root: &Path, network: &str) -> Result<Pins> {
    let pins = Pins::current(root, network);
    // `exists()` is false for a path the user may not read (the pins are mode 0700): say why.
    let there = pins
        .version_dir()
        .try_exists()
        .with_context(|| format!("reading {} (run as root)", pins.version_dir().display()))?;
    if !there {
        bail!("network {network:?} has no datapath pinned under {} (no pod yet, or another bpffsRoot)", root.display());
    }
    Ok(pins)
}

pub fn open_map(pins: &Pins, name: &str) -> Result<Map> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("{name} is not a map this build knows"))
}

/// Every pod address and its endpoint, as ENDPOINTS holds them.
pub fn endpoint_entries(pins: &Pins) -> Result<Vec<(IpKey, Endpoint)>> {
    let map: HashMap<_, IpKey, Endpoint> = HashMap::try_from(open_map(pins, names::ENDPOINTS)?)?;
    Ok(map.iter().filter_map(Result::ok).collect())
}

/// Entries of a hash map (`K` → `V`, checked against the map's sizes), counted by walking its
/// keys only: no value is copied out. Entries the programs add or remove meanwhile may or may not
/// be counted.
pub fn count_entries<K: Pod, V: Pod>(pins: &Pins, name: &str) -> Result<usize> {
    let map: HashMap<_, K, V> = HashMap::try_from(open_map(pins, name)?)?;
    Ok(map.keys().filter(Result::is_ok).count())
}

/// Each pinned map of the network and the kernel memory it holds (`memlock` of its fdinfo: for
/// a preallocated map all of its entries, for the others what is allocated), by name.
pub fn map_memory(pins: &Pins) -> Result<Vec<(String, u64)>> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let dir = pins.version_dir().join("maps");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(data) = MapData::from_pin(entry.path()) else { continue };
        let fdinfo = format!("/proc/self/fdinfo/{}", data.fd().as_fd().as_raw_fd());
        let text = fs::read_to_string(&fdinfo).with_context(|| format!("reading {fdinfo}"))?;
        let bytes = text.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok());
        out.push((name, bytes.unwrap_or(0)));
    }
    out.sort();
    Ok(out)
}

/// Packets and bytes dropped per reason, summed over CPUs; every reason, in number order.
pub fn drop_counters(pins: &Pins) -> Result<Vec<(DropReason, Counter)>> {
    let sums = per_cpu_sums(pins, names::METRICS, DropReason::ALL.map(|r| r as u32))?;
    Ok(DropReason::ALL.into_iter().zip(sums).collect())
}

/// Packets and bytes let through per path, summed over CPUs; every path, in number order.
/// `None` for a network loaded by a build before `FORWARDED` existed (2026-11-23).
pub fn forwarded_counters(pins: &Pins) -> Result<Option<Vec<(ForwardPath, Counter)>>> {
    if !pins.map(names::FORWARDED).exists() {
        return Ok(None);
    }
    let sums = per_cpu_sums(pins, names::FORWARDED, ForwardPath::ALL.map(|p| p as u32))?;
    Ok(Some(ForwardPath::ALL.into_iter().zip(sums).collect()))
}

/// The socket LB's events (`SVC_COUNTERS`, summed over CPUs) and its frontends and affinity
/// entries; `None` without the socket LB (not `kubeProxyReplacement`: its programs' links are
/// in `links/`, though the maps are pinned all the same; or another layout).
pub fn service_figures(pins: &Pins) -> Result<Option<ServiceFigures>> {
    let attached = fs::read_dir(pins.version_dir().join("links")).is_ok_and(|mut links| links.next().is_some());
    if !attached || !pins.map(names::SVC_COUNTERS).exists() {
        return Ok(None);
    }
    let sums = per_cpu_sums(pins, names::SVC_COUNTERS, ServiceEvent::ALL.map(|e| e as u32))?;
    Ok(Some(ServiceFigures {
        events: ServiceEvent::ALL.into_iter().zip(sums.into_iter().map(|c| c.packets)).collect(),
        frontends: count_entries::<ServiceKey, Service>(pins, names::SVC_FRONTENDS)?,
        affinity_entries: count_entries::<AffinityKey, Affinity>(pins, names::SVC_AFFINITY)?,
    }))
}

pub struct ServiceFigures {
    pub events: Vec<(ServiceEvent, u64)>,
    pub frontends: usize,
    pub affinity_entries: usize,
}

/// Slots of a pinned per-CPU array of counters, each summed over CPUs. A slot past the map's end
/// (a reason or path newer than the layout that loaded it) reads as zero.
fn per_cpu_sums<const N: usize>(pins: &Pins, name: &str, slots: [u32; N]) -> Result<Vec<Counter>> {
    let map: PerCpuArray<_, Counter> = PerCpuArray::try_from(open_map(pins, name)?)?;
    let len = map.len();
    slots
        .iter()
        .map(|slot| {
            if *slot >= len {
                return Ok(Counter::default());
            }
            let per_cpu = map.get(slot, 0).with_context(|| format!("reading {name}[{slot}]"))?;
            Ok(Counter {
                packets: per_cpu.iter().map(|c| c.packets).sum(),
                bytes: per_cpu.iter().map(|c| c.bytes).sum(),
            })
        })
        .collect()
}

/// When the network's programs were loaded (its pinned `from_pod`), in whole Unix seconds: the
/// kernel keeps boot-relative nanoseconds, and their wall-clock value moves by microseconds from
/// one reading to the next.
pub fn loaded_at(pins: &Pins) -> Result<Option<u64>> {
    let info = ProgramInfo::from_pin(pins.program(names::FROM_POD)).context("opening pinned from_pod")?;
    Ok(info.loaded_at().and_then(|t: SystemTime| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_secs()))
}

/// The settings the network's programs were loaded with (`SETTINGS`). The previous layout's
/// `DatapathConfig` is this build's, so either reads as it is.
pub fn settings(pins: &Pins) -> Result<DatapathConfig> {
    let array: Array<_, DatapathConfig> = Array::try_from(open_map(pins, names::SETTINGS)?)?;
    array.get(&0, 0).context("reading SETTINGS")
}
