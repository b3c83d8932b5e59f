//! Deleting a link without making the CNI caller sit out the kernel's RCU barrier.
//!
//! RTM_DELLINK is answered only after `netdev_run_todo` has run `rcu_barrier()`: 20–40 ms on a
//! small VM, most of a DEL. The device has left its namespace before that: its name, addresses,
//! routes and tc filters are gone and a new ADD may reuse the name; what remains is the kernel
//! freeing it. So a forked helper sends the request and waits out the barrier alone, and the
//! caller returns as soon as the link is no longer listed, or with the helper's error.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::{
    errno::Errno,
    sys::wait::{WaitPidFlag, WaitStatus, waitpid},
    unistd::{ForkResult, Pid, fork},
};
use rtnetlink::{
    LinkUnspec,
    packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload},
    packet_route::RouteNetlinkMessage,
    sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE},
};

use super::{local_link, netlink::Netlink};

/// How long the link may stay listed before DEL reports it stuck.
const GONE_WITHIN: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_micros(250);

impl Netlink {
    /// Deletes a link of this connection's namespace (the calling process's own: the helper
    /// inherits it, and the link is looked up there by ioctl, see `local_link`); a link that
    /// does not exist is not an error.
    pub async fn delete_link(&self, name: &str) -> Result<()> {
        if local_link::by_name(name)?.is_none() {
            return Ok(());
        }
        let request = del_link_request(name);
        // SAFETY: the plugin runs on a current-thread runtime with no other thread, so the
        // child holds no lock another thread took; it only makes syscalls and exits.
        match unsafe { fork() }.context("forking the link-deletion helper")? {
            ForkResult::Child => helper(&request),
            ForkResult::Parent { child } => self.wait_gone(name, child).await,
        }
    }

    async fn wait_gone(&self, name: &str, helper: Pid) -> Result<()> {
        let started = Instant::now();
        loop {
            match waitpid(helper, Some(WaitPidFlag::WNOHANG)).context("waiting for the helper")? {
                WaitStatus::Exited(_, 0) => return Ok(()),
                WaitStatus::Exited(_, code) if code == Errno::ENODEV as i32 => return Ok(()),
                WaitStatus::Exited(_, code) => bail!("deleting link {name}: {}", Errno::from_raw(code)),
                WaitStatus::Signaled(_, signal, _) => bail!("the helper deleting {name} died of {signal}"),
                _ => {}
            }
            if local_link::by_name(name)?.is_none() {
                return Ok(());
            }
            if started.elapsed() > GONE_WITHIN {
                bail!("link {name} is still listed {GONE_WITHIN:?} after its deletion was asked");
            }
            std::thread::sleep(POLL);
        }
    }
}

/// RTM_DELLINK by name, asking for an acknowledgement.
fn del_link_request(name: &str) -> Vec<u8> {
    let mut message = NetlinkMessage::from(RouteNetlinkMessage::DelLink(LinkUnspec::new_with_name(name).build()));
    message.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    message.finalize();
    let mut buf = vec![0; message.buffer_len()];
    message.serialize(&mut buf);
    buf
}

/// The child: lets go of every inherited descriptor (the runtime reads our stdout until EOF;
/// a held flock would block the next ADD), sends the request and exits with its errno.
fn helper(request: &[u8]) -> ! {
    // SAFETY: plain syscalls on descriptors this process owns; nothing is used afterwards.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        libc::syscall(libc::SYS_close_range, 3, u32::MAX, 0);
    }
    let code = match send_acked(request) {
        Ok(()) => 0,
        Err(errno) => errno as i32,
    };
    // SAFETY: leaves without running the parent's destructors (its runtime, its sockets).
    unsafe { libc::_exit(code) }
}

fn send_acked(request: &[u8]) -> Result<(), Errno> {
    let io = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    let socket = Socket::new(NETLINK_ROUTE).map_err(io)?;
    socket.send_to(request, &SocketAddr::new(0, 0), 0).map_err(io)?;
    let (reply, _) = socket.recv_from_full().map_err(io)?;
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply).map_err(|_| Errno::EPROTO)?;
    match reply.payload {
        NetlinkPayload::Error(e) => e.code.map_or(Ok(()), |c| Err(Errno::from_raw(-c.get()))),
        _ => Ok(()),
    }
}
