//! The kernel's socket table over `NETLINK_SOCK_DIAG` (inet_diag): list a namespace's TCP or
//! UDP sockets with their peer, inode and cookie, and destroy one (`SOCK_DESTROY`,
//! `CONFIG_INET_DIAG_DESTROY`). A netlink socket answers for the namespace it was created in,
//! so the caller creates one per namespace ([`Diag::open`] on a thread inside it).
use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const HEADER: usize = 16;
/// `struct inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKID: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, extensions, pad, states, sockid.
const REQUEST: usize = 8 + SOCKID;
/// `struct inet_diag_msg` up to and including `idiag_inode`.
const MESSAGE: usize = 4 + SOCKID + 20;
/// TCP states as inet_diag numbers them (`TCP_ESTABLISHED` is also a connected UDP socket's).
pub const ESTABLISHED: u8 = 1;
pub const LISTEN: u8 = 10;

/// One socket as the kernel lists it.
#[derive(Clone, Debug)]
pub struct DiagSocket {
    pub family: u8,
    pub protocol: u8,
    pub state: u8,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub inode: u32,
    pub cookie: u64,
    /// The `inet_diag_sockid` as received: `SOCK_DESTROY` names the socket by it.
    id: [u8; SOCKID],
}

pub struct Diag {
    fd: OwnedFd,
}

impl Diag {
    /// A sock_diag socket of the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain syscall; the descriptor is owned from here on.
        let fd =
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just created, owned by nobody else.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Every socket of `family` (`AF_INET`, `AF_INET6`) and `protocol` (6, 17), all states.
    pub fn dump(&self, family: u8, protocol: u8) -> io::Result<Vec<DiagSocket>> {
        self.send(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, &request(family, protocol, &[0; SOCKID]))?;
        let mut found = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let len = self.recv(&mut buf)?;
            for (kind, body) in messages(&buf[..len]) {
                match kind {
                    NLMSG_DONE => return Ok(found),
                    NLMSG_ERROR => return Err(nl_error(body)),
                    SOCK_DIAG_BY_FAMILY => found.extend(parse(body, protocol)),
                    _ => {}
                }
            }
        }
    }

    /// Destroys `socket`: TCP sends its peer a RST and fails the owner's calls with
    /// `ECONNABORTED`; UDP is disconnected with the same error.
    pub fn destroy(&self, socket: &DiagSocket) -> io::Result<()> {
        self.send(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, &request(socket.family, socket.protocol, &socket.id))?;
        let mut buf = vec![0u8; 4096];
        let len = self.recv(&mut buf)?;
        match messages(&buf[..len]).next() {
            Some((NLMSG_ERROR, body)) => match nl_error(body) {
                e if e.raw_os_error() == Some(0) => Ok(()),
                e => Err(e),
            },
            _ => Err(io::Error::other("no answer to SOCK_DESTROY")),
        }
    }

    fn send(&self, kind: u16, flags: u16, payload: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(HEADER + payload.len());
        msg.extend_from_slice(&((HEADER + payload.len()) as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&[0; 8]); // sequence and port id: the kernel fills in ours
        msg.extend_from_slice(payload);
        // SAFETY: a valid buffer of the given length; the kernel is the default destination.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: a valid buffer of the given length.
        let len = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if len < 0 { Err(io::Error::last_os_error()) } else { Ok(len as usize) }
    }
}

fn request(family: u8, protocol: u8, id: &[u8; SOCKID]) -> [u8; REQUEST] {
    let mut req = [0u8; REQUEST];
    req[0] = family;
    req[1] = protocol;
    req[4..8].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req[8..].copy_from_slice(id);
    req
}

/// The netlink messages in one datagram: (type, payload).
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < HEADER {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().ok()?);
        if len < HEADER || len > buf.len() {
            return None;
        }
        let body = &buf[HEADER..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((kind, body))
    })
}

fn nl_error(body: &[u8]) -> io::Error {
    let errno = body.get(0..4).map_or(libc::EIO, |b| -i32::from_ne_bytes(b.try_into().unwrap_or_default()));
    io::Error::from_raw_os_error(errno)
}

fn parse(body: &[u8], protocol: u8) -> Option<DiagSocket> {
    if body.len() < MESSAGE {
        return None;
    }
    let id: [u8; SOCKID] = body[4..4 + SOCKID].try_into().ok()?;
    let addr = |bytes: &[u8]| -> IpAddr {
        let octets: [u8; 16] = bytes.try_into().unwrap_or_default();
        if body[0] == libc::AF_INET as u8 {
            IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(octets))
        }
    };
    let port = |bytes: &[u8]| u16::from_be_bytes([bytes[0], bytes[1]]);
    let cookie = u64::from(u32::from_ne_bytes(id[40..44].try_into().ok()?))
        | (u64::from(u32::from_ne_bytes(id[44..48].try_into().ok()?)) << 32);
    Some(DiagSocket {
        family: body[0],
        protocol,
        state: body[1],
        local: SocketAddr::new(addr(&id[4..20]), port(&id[0..2])),
        peer: SocketAddr::new(addr(&id[20..36]), port(&id[2..4])),
        inode: u32::from_ne_bytes(body[MESSAGE - 4..MESSAGE].try_into().ok()?),
        cookie,
        id,
    })
}
