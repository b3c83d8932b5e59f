//! connect (TCP, connected UDP) and sendmsg (unconnected UDP) to a frontend: the socket gets a
//! backend's address instead, and `SVC_SOCKETS` remembers which frontend it addressed.
use aya_ebpf::{EbpfContext as _, helpers, programs::SockAddrContext};
use ebpf_common::{DropReason, FAMILY_IPV4, ServiceEvent, ServiceKey, SocketKey, SocketService};

use super::{
    addr,
    maps::{SVC_SOCKETS, count},
    pick::{Pick, pick},
};

/// The verdicts of a `sock_addr` program.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;
const ECONNREFUSED: i32 = 111;

#[inline(always)]
pub fn translate(ctx: &SockAddrContext, family: u8, event: ServiceEvent) -> i32 {
    // SAFETY: the kernel's context.
    let protocol = unsafe { (*ctx.sock_addr).protocol };
    if protocol != IPPROTO_TCP && protocol != IPPROTO_UDP {
        return ALLOW;
    }
    // An IPv4-mapped address reads as IPv4 (`addr.rs`): an `AF_INET6` socket connecting to
    // `::ffff:<ClusterIP>` gets the IPv4 Service, as an `AF_INET` socket would. (Its unconnected
    // sends to one never reach sendmsg6: the kernel hands them to its IPv4 path, whose sendmsg4
    // hook sees a plain IPv4 address.)
    let addressed = addr::read(ctx, family);
    let frontend =
        ServiceKey { addr: addressed.addr, port: addressed.port, protocol: protocol as u8, family: addressed.family };
    let mut picked = pick(ctx, &frontend);
    // A NodePort is keyed "any node address" (address zero): a pod or the node calling its
    // own node's NodePort (hairpin) gets it here, without a packet to translate.
    if matches!(picked, Pick::NotAService) && is_node_address(addressed.family, &addressed.addr) {
        picked = pick(ctx, &ServiceKey { addr: [0; 16], ..frontend });
    }
    match picked {
        Pick::NotAService => ALLOW,
        Pick::NoEndpoint => refuse(),
        // The writer keeps a Service's backends of its own family; anything else is refused
        // rather than written into the wrong fields. An IPv4 backend of a mapped frontend is
        // written mapped.
        Pick::To(backend) if backend.family != addressed.family => refuse(),
        Pick::To(backend) => {
            addr::write(ctx, family, &backend);
            // SAFETY: a helper the sock_addr programs may call with their context.
            let cookie = unsafe { helpers::bpf_get_socket_cookie(ctx.as_ptr()) };
            // A full LRU forgets its oldest socket: that one then shows its backend as its peer.
            let _ = SVC_SOCKETS.insert(SocketKey { cookie, backend, pad: 0 }, SocketService { frontend }, 0);
            count(event);
            ALLOW
        }
    }
}

/// The node's address of `family` (`nodeIP`, `nodeIPv6`).
#[inline(always)]
fn is_node_address(family: u8, addr: &[u8; 16]) -> bool {
    let config = crate::config::get();
    if family == FAMILY_IPV4 {
        config.node_ipv4 != [0; 4] && addr[..4] == config.node_ipv4
    } else {
        config.node_ipv6 != [0; 16] && *addr == config.node_ipv6
    }
}

/// A Service without endpoints: the call fails with `ECONNREFUSED` at once, as kube-proxy's
/// REJECT answers (a rejection without a return value would be `EPERM`).
#[inline(always)]
fn refuse() -> i32 {
    crate::maps::count_drop_event(DropReason::ServiceNoEndpoint);
    // SAFETY: a helper cgroup programs may call; it sets the syscall's error.
    unsafe { helpers::bpf_set_retval(-ECONNREFUSED) };
    REJECT
}
