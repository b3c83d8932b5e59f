//! The largest maps of a first load, created before aya's loader runs, on as many threads as the
//! node has CPUs, and pinned where the loader finds them (`EbpfLoader::map_pin_path`).
//!
//! aya creates an object's maps one after the other, and a preallocated map costs the kernel
//! time in proportion to its size: `POLICY_FLOWS` (262,144 LRU entries) and `POLICY_COUNTS`
//! (16,384 per-CPU slots) about 8 ms each here, `FLOWS`, `NAT`, `NAT_SHARES` and `SVC_BACKENDS`
//! 2–4 ms each, the other maps together about 1 ms. Created ahead in parallel they take the
//! longest thread's share instead of their sum. They are created from the object's own
//! definitions and BTF, as aya would create them (key and value types included, for `bpftool
//! map dump`), with the same entry counts.
use std::{
    io,
    os::fd::{AsFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use aya::maps::MapData;
use aya_obj::{
    Object,
    generated::{bpf_attr, bpf_cmd},
};
use ebpf_common::names;

use super::{datapath::internal, pins::Pins};
use crate::cni::{CniResult, Context as _, ErrorCode};

/// By creation time on this machine (kernel 6.18), longest first: handed to the threads in turn.
pub const AHEAD: [&str; 6] =
    [names::POLICY_FLOWS, names::POLICY_COUNTS, names::FLOWS, names::SVC_BACKENDS, names::NAT, names::NAT_SHARES];

/// Creates and pins [`AHEAD`]'s maps of `object`, each with the entries `entries` gives it (or
/// its own); returns their names, for the loader to take from their pins. None when the kernel
/// takes no BTF: aya then creates every map itself, as before.
pub fn create(object: &[u8], entries: &[(&str, u32)], pins: &Pins) -> CniResult<Vec<&'static str>> {
    let started = std::time::Instant::now();
    let mut object = Object::parse(object).cni(ErrorCode::INTERNAL, "cannot parse the eBPF object")?;
    let Some(features) = aya::features().btf() else { return Ok(Vec::new()) };
    let Some(btf) = object.fixup_and_sanitize_btf(features).cni(ErrorCode::INTERNAL, "cannot prepare the BTF")? else {
        return Ok(Vec::new());
    };
    let btf = load_btf(&btf.to_bytes()).cni(ErrorCode::DATAPATH, "kernel refused the object's BTF")?;
    log::debug!("object parsed and its BTF loaded in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let mut maps = Vec::new();
    for name in AHEAD {
        let mut map = object.maps.remove(name).ok_or_else(|| internal(format!("object has no map {name}")))?;
        if let Some(&(_, count)) = entries.iter().find(|(map, _)| *map == name) {
            map.set_max_entries(count);
        }
        maps.push((name, map));
    }
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(maps.len());
    let mut shares: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, map) in maps.into_iter().enumerate() {
        shares[i % workers].push(map);
    }
    let btf = btf.as_fd();
    std::thread::scope(|scope| {
        let threads: Vec<_> =
            shares.into_iter().map(|share| scope.spawn(move || create_share(share, btf, pins))).collect();
        threads.into_iter().try_for_each(|t| t.join().unwrap_or_else(|_| Err(internal("a map creation panicked"))))
    })?;
    Ok(AHEAD.to_vec())
}

fn create_share(share: Vec<(&str, aya_obj::Map)>, btf: BorrowedFd<'_>, pins: &Pins) -> CniResult<()> {
    for (name, map) in share {
        let started = std::time::Instant::now();
        let map =
            MapData::create(map, name, Some(btf)).cni(ErrorCode::DATAPATH, format!("cannot create map {name}"))?;
        map.pin(pins.map(name)).cni(ErrorCode::DATAPATH, format!("cannot pin map {name}"))?;
        log::debug!("{name} created in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

/// `BPF_BTF_LOAD` (aya's own is private): the object's BTF, for the maps' key and value types.
fn load_btf(raw: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: a plain C struct, all zeros is its empty value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the union's member for `BPF_BTF_LOAD`.
    let load = unsafe { &mut attr.__bindgen_anon_7 };
    load.btf = raw.as_ptr() as u64;
    load.btf_size = u32::try_from(raw.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `attr` is valid for the call and `raw` outlives it; the result is a new fd or -1.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, bpf_cmd::BPF_BTF_LOAD as libc::c_long, &raw mut attr, size_of::<bpf_attr>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
