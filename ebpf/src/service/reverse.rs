//! recvmsg (a datagram's source) and getpeername (the peer): a translated socket sees the
//! frontend it addressed, not the backend, so a resolver matches replies to its query and an
//! application logs the Service it called.
use aya_ebpf::{EbpfContext as _, helpers, programs::SockAddrContext};
use ebpf_common::{ServiceEvent, SocketKey};

use super::{
    addr,
    maps::{SVC_SOCKETS, count},
};

/// These hooks cannot refuse: 1 is their only valid verdict.
const ALLOW: i32 = 1;

/// An `AF_INET6` socket on an IPv4 backend (mapped) finds it under its IPv4 form, as the
/// connect stored it, and sees the frontend mapped (`addr.rs`).
#[inline(always)]
pub fn reverse(ctx: &SockAddrContext, family: u8, event: ServiceEvent) -> i32 {
    let backend = addr::read(ctx, family);
    // SAFETY: a helper the sock_addr programs may call with their context.
    let cookie = unsafe { helpers::bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: copied at once.
    if let Some(seen) = unsafe { SVC_SOCKETS.get(SocketKey { cookie, backend, pad: 0 }).copied() }
        && seen.frontend.family == backend.family
    {
        let f = seen.frontend;
        addr::write(ctx, family, &ebpf_common::Backend { addr: f.addr, port: f.port, family: f.family, pad: 0 });
        count(event);
    }
    ALLOW
}
