//! One probe: from a pod's namespace, a TCP connection (connect, ask, read the server's tag)
//! or a UDP datagram (send, read the echoed tag) to a pod's port, within a short timeout. Each
//! probe binds a source port of its own, never reused in a run, so no flow state a former
//! probe left (an allowed flow's verdict, cached until it ages) can answer for a new one.
use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use nix::sched::{CloneFlags, setns};
use socket2::{Domain, Socket, Type};

use super::model::{Protocol, Target};

/// Source ports handed out in turn (far from the servers' 80 and 81).
const FIRST_PORT: u32 = 20_000;
const PORTS: u32 = 40_000;
static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

fn source_port() -> u16 {
    (FIRST_PORT + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % PORTS) as u16
}

/// What one probe is to do.
#[derive(Clone, Debug)]
pub struct Probe {
    pub from_netns: String,
    pub to: IpAddr,
    pub target: Target,
    /// What the server must answer (its pod's name): an answer from another pod is no success.
    pub tag: String,
}

/// Runs `probe` on this thread, which it moves into the pod's namespace (call it on a thread
/// of its own): `Ok` when the right server answered within `timeout`, else why not.
pub fn probe_once(probe: &Probe, timeout: Duration) -> Result<(), String> {
    let ns = std::fs::File::open(format!("/run/netns/{}", probe.from_netns)).map_err(|e| e.to_string())?;
    setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns: {e}"))?;
    let to = SocketAddr::new(probe.to, probe.target.port);
    let any: IpAddr = if to.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let from = SocketAddr::new(any, source_port());
    let answer = match probe.target.protocol {
        Protocol::Tcp => tcp(from, to, timeout),
        Protocol::Udp => udp(from, to, timeout),
    }
    .map_err(|e| e.kind().to_string())?;
    if answer == probe.tag { Ok(()) } else { Err(format!("answered by {answer:?}")) }
}

fn tcp(from: SocketAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&from.into())?;
    socket.connect_timeout(&to.into(), timeout)?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"q")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn udp(from: SocketAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let socket = UdpSocket::bind(from)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.send_to(b"q", to)?;
    let mut buf = [0u8; 64];
    loop {
        let (n, peer) = socket.recv_from(&mut buf)?;
        // Only the server's own answer counts (its address, its port).
        if peer.ip().to_canonical() == to.ip() && peer.port() == to.port() {
            return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
}
