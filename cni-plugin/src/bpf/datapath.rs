//! A network's datapath in the kernel: programs and maps loaded and pinned once, then reused by
//! every later ADD; endpoints and tc filters added and removed per attachment. Every operation
//! runs under a node-wide lock (flock on the bpffs root) so concurrent ADDs load only once and a
//! DEL never removes the pins an ADD is about to use.
use std::{
    collections::BTreeSet,
    fs::{self, DirBuilder, File},
    io::ErrorKind,
    net::{IpAddr, Ipv6Addr},
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::Path,
    sync::Arc,
};

use aya::{
    maps::{HashMap, Map, MapData, MapError},
    programs::{
        SchedClassifier, TcAttachType,
        tc::{self, NlOptions, TcAttachOptions},
    },
};
use ebpf_common::{Endpoint, IpKey, names};
use nix::fcntl::{Flock, FlockArg};

use super::{bpffs::on_bpffs_or_below, pins::Pins};
use crate::{
    cni::{CniError, CniResult, Context, ErrorCode},
    net::netlink::Netlink,
};

pub struct Datapath {
    pub(super) pins: Pins,
    /// Shared by the views of other layouts' pins under the same lock ([`Self::view`]).
    _lock: Arc<Flock<File>>,
}

impl Datapath {
    /// Locks the bpffs root (creating it, mode 0700) for the lifetime of the value. The root
    /// or its parent must already be on bpffs (ADD and STATUS mount it first, see
    /// [`Datapath::mount_bpffs`]): nothing is created on any other filesystem.
    pub fn lock(root: &Path, network: &str) -> CniResult<Self> {
        if !on_bpffs_or_below(root) {
            let probe = if root.exists() { root } else { root.parent().unwrap_or(root) };
            return Err(CniError::new(ErrorCode::DATAPATH, format!("{} is not on a bpffs mount", probe.display()))
                .with_details("mount it with `mount -t bpf bpf /sys/fs/bpf` or set bpffsRoot"));
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .cni(ErrorCode::DATAPATH, format!("cannot create {}", root.display()))?;
        // Pinned maps steer every pod's traffic: nobody but root may even list them, whoever
        // created the directory.
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .cni(ErrorCode::DATAPATH, format!("cannot restrict {} to root", root.display()))?;
        let dir = File::open(root).cni(ErrorCode::DATAPATH, "cannot open bpffs root")?;
        let lock = Flock::lock(dir, FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .cni(ErrorCode::DATAPATH, "cannot lock bpffs root")?;
        // Chosen under the lock: a concurrent last DEL may be removing the previous layout.
        Ok(Self { pins: Pins::current(root, network), _lock: Arc::new(lock) })
    }

    /// Mounts bpffs for `root` when the node has none there (a fresh node), saying so in the
    /// log. Only ADD and STATUS do: DEL, CHECK and GC have nothing to find on a fresh mount.
    pub fn mount_bpffs(root: &Path) -> CniResult<()> {
        match super::bpffs::ensure_mounted(root) {
            Ok(None) => Ok(()),
            Ok(Some(at)) => {
                log::info!("bpffs was not mounted: mounted it on {}", at.display());
                Ok(())
            }
            Err(e) => Err(CniError::new(
                ErrorCode::DATAPATH,
                format!("{} is not on bpffs and bpffs cannot be mounted there", root.display()),
            )
            .with_details(format!("{e}; mount it with `mount -t bpf bpf /sys/fs/bpf` or set bpffsRoot"))),
        }
    }

    pub fn is_loaded(&self) -> bool {
        // The program is pinned last, so its pin means maps and program are all there.
        self.pins.program(names::FROM_POD).exists()
    }

    pub(super) fn endpoints(&self) -> CniResult<Option<HashMap<MapData, IpKey, Endpoint>>> {
        let path = self.pins.map(names::ENDPOINTS);
        if !path.exists() {
            return Ok(None);
        }
        let data = MapData::from_pin(&path).cni(ErrorCode::DATAPATH, "cannot open pinned ENDPOINTS")?;
        let map = Map::from_map_data(data).cni(ErrorCode::DATAPATH, "cannot open pinned ENDPOINTS")?;
        HashMap::try_from(map).map(Some).cni(ErrorCode::DATAPATH, "pinned ENDPOINTS has another layout")
    }

    /// Inserts the attachment's endpoints (one per pod address), opening the map once. A full
    /// map is its own error: the node has more pods than `ENDPOINTS` was sized for.
    /// `link_local` gets an entry of its own, flagged: it vouches for the pod's link-local
    /// traffic and is never a destination.
    ///
    /// Nothing of another attachment is overwritten: the link-local address comes from the
    /// pod's MAC (EUI-64), so a pod given another pod's MAC (`mac` capability, `CNI_ARGS MAC=`)
    /// would take over that pod's link-local entry (its neighbour discovery then dropped as
    /// spoofed) and its DEL would remove it. A `requested_mac` is also refused when any
    /// endpoint of the network has it, IPv4-only pods included. Checked under the network's
    /// lock, so two ADDs asking for one MAC cannot both pass.
    pub fn add_endpoints(
        &self,
        ips: &[IpAddr],
        link_local: Option<Ipv6Addr>,
        endpoint: Endpoint,
        requested_mac: Option<[u8; 6]>,
    ) -> CniResult<()> {
        let mut map = self.endpoints()?.ok_or_else(|| internal("ENDPOINTS is not pinned"))?;
        let entries: Vec<(IpAddr, Endpoint)> = ips
            .iter()
            .map(|ip| (*ip, endpoint))
            .chain(link_local.map(|ll| {
                (IpAddr::V6(ll), Endpoint { flags: endpoint.flags | ebpf_common::ENDPOINT_LINK_LOCAL, ..endpoint })
            }))
            .collect();
        if let Some(mac) = requested_mac
            && let Some(held) =
                map.iter().filter_map(Result::ok).find(|(_, e)| e.pod_mac == mac && e.owner != endpoint.owner)
        {
            return Err(mac_taken(mac, &held.1));
        }
        for (ip, new) in &entries {
            match map.get(&ip_key(*ip), 0) {
                Ok(held) if held.owner != new.owner => {
                    return Err(match link_local {
                        Some(ll) if IpAddr::V6(ll) == *ip => mac_taken(new.pod_mac, &held),
                        _ => CniError::new(
                            ErrorCode::ADDRESS_TAKEN,
                            format!(
                                "address {ip} has the endpoint of another pod (host veth ifindex {})",
                                held.host_ifindex
                            ),
                        ),
                    });
                }
                Ok(_) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e).cni(ErrorCode::DATAPATH, format!("cannot look up endpoint {ip}")),
            }
        }
        self.claim_host_veth(&endpoint, ips)?;
        let inserted = insert_endpoints(&mut map, entries);
        if inserted.is_err() {
            // The rollback's DEL finds the slot by the endpoints, of which none may be there.
            let _ = self.release_host_veths(&BTreeSet::from([(endpoint.host_ifindex, endpoint.owner)]));
        }
        inserted
    }

    /// Removes every endpoint the attachment owns; returns how many. With `ips`, the
    /// attachment's addresses as IPAM recorded them, by key: each entry, and the IPv6
    /// link-local one made from its pod's MAC, removed only if `owner`'s. Without, by a walk of
    /// the whole map (one entry per address of every pod of the node).
    pub fn remove_endpoints(&self, owner: u64, ips: Option<&[IpAddr]>) -> CniResult<usize> {
        let Some(ips) = ips else { return self.remove_endpoints_where(|o| o == owner) };
        let Some(mut map) = self.endpoints()? else { return Ok(0) };
        let mut keys = Vec::new();
        let mut veths = BTreeSet::new();
        let mut owned = |key: IpKey, keys: &mut Vec<IpKey>| match map.get(&key, 0) {
            Ok(entry) if entry.owner == owner && !keys.contains(&key) => {
                keys.push(key);
                veths.insert((entry.host_ifindex, entry.owner));
                Some(entry)
            }
            _ => None,
        };
        for ip in ips {
            let Some(entry) = owned(ip_key(*ip), &mut keys) else { continue };
            if ip.is_ipv6() {
                let link_local = crate::net::sysctl::eui64_link_local(entry.pod_mac);
                owned(ip_key(IpAddr::V6(link_local)), &mut keys);
            }
        }
        // The slots first: a slot without its endpoints would still vouch for the address.
        self.release_host_veths(&veths)?;
        for key in &keys {
            map.remove(key).cni(ErrorCode::DATAPATH, "cannot remove endpoint")?;
        }
        Ok(keys.len())
    }

    /// Removes every endpoint whose owner `stale` picks, and their host veths' `HOST_VETHS`
    /// slots; returns how many endpoints.
    pub fn remove_endpoints_where(&self, stale: impl Fn(u64) -> bool) -> CniResult<usize> {
        let Some(mut map) = self.endpoints()? else { return Ok(0) };
        let removed: Vec<(IpKey, Endpoint)> =
            map.iter().filter_map(Result::ok).filter(|(_, ep)| stale(ep.owner)).collect();
        // The slots first: a slot without its endpoints would still vouch for the address.
        let veths: BTreeSet<(u32, u64)> = removed.iter().map(|(_, ep)| (ep.host_ifindex, ep.owner)).collect();
        self.release_host_veths(&veths)?;
        for (key, _) in &removed {
            map.remove(key).cni(ErrorCode::DATAPATH, "cannot remove endpoint")?;
        }
        Ok(removed.len())
    }

    /// Attaches `from_pod` to the host veth's ingress as a direct-action cls_bpf filter under a
    /// new clsact qdisc. Not TCX: every TCX attach waits for an RCU grace period (`synchronize_rcu`
    /// in tcx_link_attach, about 10 ms on a small VM, more than the rest of ADD), and a filter on
    /// a fresh qdisc does not. The filter belongs to the device: it outlives this process and
    /// goes away with the veth, so DEL and GC need no pin for it.
    ///
    /// `to_pod` goes on the egress: it sees what the node's stack delivers into the pod.
    pub fn attach(&self, host_ifname: &str) -> CniResult<()> {
        for (name, direction) in [(names::TO_POD, TcAttachType::Egress), (names::FROM_POD, TcAttachType::Ingress)] {
            let mut program = SchedClassifier::from_pin(self.pins.program(name))
                .cni(ErrorCode::DATAPATH, format!("cannot open pinned {name}"))?;
            attach_filter(&mut program, host_ifname, direction)?;
        }
        Ok(())
    }

    /// Other pins of the same network, under the lock this value holds.
    fn view(&self, pins: Pins) -> Self {
        Self { pins, _lock: Arc::clone(&self._lock) }
    }

    /// Finishes an unload of the previous layout's pins that was interrupted (a last DEL or GC
    /// killed after it unpinned `from_pod`, the mark of a complete load, and before the
    /// directory was gone). Nothing can attach to such pins any more, but their directory would
    /// refuse this build's load (code 102) for ever, and their uplink filters, if not yet
    /// detached, would go on running beside this build's. Left alone while its `ENDPOINTS`
    /// still has entries (pods of that release); returns whether anything was removed.
    pub async fn finish_interrupted_unload(&self, node: &Netlink) -> CniResult<bool> {
        if self.pins.is_previous() {
            return Ok(false);
        }
        let previous = self.pins.other_version(super::pins::PREVIOUS_LAYOUT_VERSION);
        if !previous.version_dir().exists() || previous.program(names::FROM_POD).exists() {
            return Ok(false);
        }
        let previous = self.view(previous);
        let removed = previous.remove_own_if_unused(node).await?;
        if removed {
            log::info!(
                "removed the pins of layout v{} whose removal an interrupted DEL or GC had left",
                previous.pins.version()
            );
        }
        Ok(removed)
    }

    /// Removes the network's pins of this layout when no endpoint is left (every attachment
    /// has one per address). Filters still running the programs keep them alive until their
    /// veths go. An interrupted unload of the previous layout is finished first.
    pub async fn remove_if_unused(&self, node: &Netlink) -> CniResult<bool> {
        let previous = self.finish_interrupted_unload(node).await;
        let own = self.remove_own_if_unused(node).await;
        previous.and(own)
    }

    async fn remove_own_if_unused(&self, node: &Netlink) -> CniResult<bool> {
        let endpoints_left = match self.endpoints()? {
            Some(map) => map.keys().next().is_some(),
            None => false,
        };
        if endpoints_left {
            return Ok(false);
        }
        // The mark of a complete load goes first: should what follows fail or be interrupted,
        // the next ADD loads again (and removes leftovers first) rather than trust a datapath
        // whose uplink filters may be gone.
        match fs::remove_file(self.pins.program(names::FROM_POD)) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).cni(ErrorCode::DATAPATH, "cannot unpin from_pod");
            }
            _ => {}
        }
        crate::fault::point("del:mid-unload");
        self.detach_uplink(node).await?;
        match fs::remove_dir_all(self.pins.version_dir()) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).cni(ErrorCode::DATAPATH, "cannot remove network pins");
            }
            _ => {}
        }
        // The network's directory goes too unless another layout's pins are still in it.
        let _ = fs::remove_dir(self.pins.network_dir());
        Ok(true)
    }
}

/// Attaches a loaded program as a direct-action cls_bpf filter under the interface's clsact
/// qdisc (added unless there is one: an uplink's may be shared with others); returns whether it
/// added the qdisc. The filter stays when the handle is dropped, for as long as the device or
/// until it is removed.
pub(super) fn attach_filter(program: &mut SchedClassifier, ifname: &str, direction: TcAttachType) -> CniResult<bool> {
    let added = add_clsact(ifname)?;
    let id = program
        .attach_with_options(ifname, direction, TcAttachOptions::Netlink(NlOptions::default()))
        .cni(ErrorCode::DATAPATH, format!("cannot attach a filter to {ifname} ({direction:?})"))?;
    let link = program.take_link(id).cni(ErrorCode::INTERNAL, "attached filter vanished")?;
    std::mem::forget(link);
    Ok(added)
}

fn insert_endpoints(map: &mut HashMap<MapData, IpKey, Endpoint>, entries: Vec<(IpAddr, Endpoint)>) -> CniResult<()> {
    for (ip, endpoint) in entries {
        match map.insert(ip_key(ip), endpoint, 0) {
            Ok(()) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::E2BIG) => {
                return Err(CniError::new(
                    ErrorCode::DATAPATH_FULL,
                    format!("ENDPOINTS is full ({} entries): no room for {ip}", ebpf_common::ENDPOINTS_MAX_ENTRIES),
                )
                .with_details("every address of every pod on this node has an entry; delete pods first"));
            }
            Err(e) => return Err(e).cni(ErrorCode::DATAPATH, format!("cannot add endpoint {ip}")),
        }
    }
    Ok(())
}

/// Adds a clsact qdisc to the interface unless it has one; returns whether it added it.
///
/// The first filter under a new clsact waits for an RCU grace period unless one has passed
/// since the qdisc was made (`mini_qdisc_pair_swap` then runs `synchronize_rcu_expedited`: up
/// to 20 ms on a busy VM). So the qdisc is added as early as the interface exists, and the
/// filters come after other work (the verifier's, for the uplink; the pod's addresses, routes
/// and endpoint, for a host veth) during which a grace period usually passes.
pub fn add_clsact(ifname: &str) -> CniResult<bool> {
    match tc::qdisc_add_clsact(ifname) {
        Ok(()) => Ok(true),
        Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e).cni(ErrorCode::DATAPATH, format!("cannot add a clsact qdisc to {ifname}")),
    }
}

/// A pod asked for a MAC that another pod of the network holds. Code 103 (`ADDRESS_TAKEN`), as
/// for a requested IP another attachment holds: not 11 (try again later), since it clears only
/// when the other pod is deleted and a retry of the same request fails the same way; not 7,
/// since the configuration is valid and the same request succeeds where no pod has that MAC.
fn mac_taken(mac: [u8; 6], held: &Endpoint) -> CniError {
    let mac = crate::net::netlink::format_mac(mac);
    CniError::new(ErrorCode::ADDRESS_TAKEN, format!("MAC {mac} is another pod's on this network")).with_details(
        format!(
            "the pod behind host veth ifindex {} has it (and the IPv6 link-local address made from it); \
             ask for another MAC or none",
            held.host_ifindex
        ),
    )
}

pub(super) fn internal(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::INTERNAL, msg)
}

/// The `ENDPOINTS` key of an address.
pub fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}
