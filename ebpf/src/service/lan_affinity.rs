//! ClientIP affinity for clients on the LAN (per-packet flows to NodePorts, LoadBalancer IPs,
//! externalIPs), in `SVC_AFFINITY` beside the local sockets' entries.
//!
//! The client is its address, in the key's `netns_cookie` field with the top bit set: netns
//! cookies are a counter from 1, so a LAN client's key never equals a pod's, and a pod and a
//! LAN client of the same Service never share an entry. IPv4: the address itself (bits 0-31,
//! as a big-endian number: a dump reads `0x80000000c0000264` for 192.0.2.100). IPv6: bit 62
//! set too, and 62 bits of a hash of the full address (as kube-proxy, the whole address is the
//! client, not its /64). Two addresses of equal hash share one backend choice, never a flow:
//! by chance, once some 2^31 clients of one Service are remembered at a time (the birthday
//! bound of 62 bits, far beyond the map's 65,536 entries); on purpose, an attacker who can
//! complete handshakes from an address chosen to collide (the hash is not keyed: the layout has
//! no room for a secret) sets which of the Service's own backends a victim's next flow gets.
//!
//! The wire is hostile, so only a flow our state machine accepts records or refreshes an entry
//! (`established`, called by `ct::seen`): TCP at the backend's first segment without RST after
//! the client's ACK (our states read flags, not sequence numbers: a blind ACK from a forged
//! source moves the flow to ESTABLISHED too, but the backend answers it with a RST), UDP when
//! the backend's first reply passes (a forged source's datagram is answered all the same: as
//! kube-proxy's `recent` match, which every first packet sets). A SYN from a forged source only
//! reads the table (`previous`). The timestamp is the last established flow's start.
use aya_ebpf::helpers::bpf_ktime_get_ns;
use ebpf_common::{
    Affinity, AffinityKey, Backend, FAMILY_IPV4, FlowKey, SERVICE_AFFINITY, SERVICE_EXTERNAL, SVC_CT_FORWARD, Service,
    ServiceEvent, ServiceKey, SvcCtEntry,
};

use super::{
    affinity::still_sticky,
    maps::{SVC_AFFINITY, SVC_FRONTENDS, count as count_event},
};
use crate::config;

/// Set in every LAN client's key: never in a netns cookie.
const LAN_CLIENT: u64 = 1 << 63;
/// Set too for an IPv6 client, so no IPv6 hash equals an IPv4 address's key.
const LAN_CLIENT_V6: u64 = 1 << 62;

/// The key of `client` (an address of `family`) for the Service `service`.
#[inline(always)]
pub fn key(family: u8, client: &[u8; 16], service: u32) -> AffinityKey {
    let netns_cookie = if family == FAMILY_IPV4 {
        LAN_CLIENT | u64::from(u32::from_be_bytes([client[0], client[1], client[2], client[3]]))
    } else {
        LAN_CLIENT | LAN_CLIENT_V6 | (hash6(client) >> 2)
    };
    AffinityKey { netns_cookie, service, pad: 0 }
}

/// 64 bits of an IPv6 address: both halves through a 64-bit finaliser (multiply, xor-shift),
/// so that every bit of the address moves about half the result's.
#[inline(always)]
fn hash6(addr: &[u8; 16]) -> u64 {
    let half = |bytes: &[u8]| bytes.iter().fold(0u64, |word, b| (word << 8) | u64::from(*b));
    mix(half(&addr[..8]) ^ mix(half(&addr[8..])))
}

#[inline(always)]
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The slot (in the Service's current bank) of the backend the client of `flow`, a new flow to
/// a ClientIP Service, had: within the timeout and still a backend; else `None`, and the
/// caller picks at random. Counted as an affinity hit.
#[inline(always)]
pub fn previous(flow: &FlowKey, service: &Service) -> Option<u16> {
    let (_, index) = still_sticky(&key(flow.family, &flow.src_addr, service.id), service)?;
    count_event(ServiceEvent::AffinityHit);
    Some(index)
}

/// A tracked flow was accepted (see the module's comment) by the packet with `key` (either way) and its
/// `entry` (the map's, not a copy): its client's affinity names its backend from now on, if
/// the Service has ClientIP. The Service is found again by its frontend (one lookup, two for a
/// NodePort): once per established flow of any external Service, never per packet, as
/// `SvcCtEntry` has no room to say which Service a flow is of.
///
/// Written to need little stack (fields read in place, nothing copied that a pointer can stand
/// for): `svc_from_uplink` inlines it with 8 of its 512 bytes to spare.
#[inline(always)]
pub fn established(key: &FlowKey, entry: &SvcCtEntry) {
    // The forward entry is keyed client → frontend and says where to (the backend); the reply
    // entry is keyed backend → client (or node:port) and says what it becomes (frontend →
    // client).
    let forward = entry.direction == SVC_CT_FORWARD;
    let (client, front, front_port) = if forward {
        (&key.src_addr, &key.dst_addr, key.dst_port)
    } else {
        (&entry.dst_addr, &entry.src_addr, entry.src_port)
    };
    let mut frontend = ServiceKey { addr: *front, port: front_port, protocol: key.protocol, family: key.family };
    let mut service = SVC_FRONTENDS.get_ptr(&frontend);
    // A NodePort is keyed "any node address" (see `frontend.rs`).
    if service.is_none() && is_node(key.family, front) {
        frontend.addr = [0; 16];
        service = SVC_FRONTENDS.get_ptr(&frontend);
    }
    let Some(service) = service else { return };
    // SAFETY: a value of the map, valid while this program runs; the writer replaces it whole.
    let (flags, id) = unsafe { ((*service).flags, (*service).id) };
    if flags & SERVICE_EXTERNAL == 0 || flags & SERVICE_AFFINITY == 0 {
        return;
    }
    let (addr, port) = if forward { (&entry.dst_addr, entry.dst_port) } else { (&key.src_addr, key.src_port) };
    // SAFETY: a helper any program may call.
    let last_ns = unsafe { bpf_ktime_get_ns() };
    let value = Affinity { backend: Backend { addr: *addr, port, family: key.family, pad: 0 }, pad: 0, last_ns };
    // A full LRU forgets its oldest client: that client gets a new backend next time.
    let _ = SVC_AFFINITY.insert(&self::key(key.family, client, id), &value, 0);
}

/// `established` as a BPF function of its own, for `svc_to_uplink`: its frame and this one's
/// fit the stack together, and its own does not have room for `established` inlined.
#[inline(never)]
pub fn established_call(key: &FlowKey, entry: &SvcCtEntry) {
    established(key, entry);
}

/// Whether `addr` is the node's address of `family`.
#[inline(always)]
fn is_node(family: u8, addr: &[u8; 16]) -> bool {
    let config = config::get();
    if family == FAMILY_IPV4 {
        config.node_ipv4 != [0; 4] && addr[..4] == config.node_ipv4
    } else {
        config.node_ipv6 != [0; 16] && *addr == config.node_ipv6
    }
}
