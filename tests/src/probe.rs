//! Clients and servers for flow tests. A server answers every request with the address it saw
//! the request come from; a client succeeds only if its request is answered by the very
//! address it asked for (a connected TCP or UDP socket: the kernel drops a reply from anywhere
//! else, so a reply that was not translated back shows up as a timeout), within
//! [`FLOW_TIMEOUT`].
use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::traffic::in_netns;

/// How long a client waits to connect, and then for its answer: short, so that a suite with
/// failing flows still ends quickly.
pub const FLOW_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a server looks at its stop flag.
const POLL: Duration = Duration::from_millis(50);

/// Echo-the-source servers, stopped (and joined) on drop.
#[derive(Default)]
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Servers {
    /// A TCP server on `at` inside `netns`; each connection is served on its own thread.
    pub fn tcp(&mut self, netns: &str, at: impl Into<SocketAddr>) -> Result<()> {
        let at = at.into();
        let listener: TcpListener = in_netns(netns, move || Ok(TcpListener::bind(at)?))
            .with_context(|| format!("TCP server on {at} in {netns}"))?;
        listener.set_nonblocking(true)?;
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, peer)) => drop(std::thread::spawn(move || answer_tcp(stream, peer))),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        }));
        Ok(())
    }

    /// A UDP server on `at` inside `netns`: answers each datagram to its sender.
    pub fn udp(&mut self, netns: &str, at: impl Into<SocketAddr>) -> Result<()> {
        let at = at.into();
        let socket: UdpSocket = in_netns(netns, move || Ok(UdpSocket::bind(at)?))
            .with_context(|| format!("UDP server on {at} in {netns}"))?;
        socket.set_read_timeout(Some(POLL))?;
        let stop = self.stop.clone();
        self.threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(peer.to_string().as_bytes(), peer);
                }
            }
        }));
        Ok(())
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn answer_tcp(mut stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(FLOW_TIMEOUT));
    let mut buf = [0u8; 64];
    if stream.read(&mut buf).is_ok() {
        let _ = stream.write_all(peer.to_string().as_bytes());
    }
}

/// Connects from `netns` to `to` over TCP, asks, and returns the address the server saw.
pub fn ask_tcp(netns: &str, to: impl Into<SocketAddr>) -> Result<SocketAddr> {
    let to = to.into();
    let mut stream = in_netns(netns, move || {
        let stream =
            TcpStream::connect_timeout(&to, FLOW_TIMEOUT).map_err(|e| anyhow::anyhow!("no connection: {e}"))?;
        Ok(stream)
    })?;
    let peer = stream.peer_addr()?;
    if peer != to {
        bail!("connected to {peer}, not to {to}");
    }
    stream.set_read_timeout(Some(FLOW_TIMEOUT))?;
    stream.write_all(b"hello")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).map_err(|e| anyhow::anyhow!("connected, but no answer: {e}"))?;
    parse_seen(&buf[..n])
}

/// Sends one datagram from `netns` on a socket connected to `to` and returns the address the
/// server saw; a reply from any address but `to` never reaches the socket.
pub fn ask_udp(netns: &str, to: impl Into<SocketAddr>) -> Result<SocketAddr> {
    let to = to.into();
    let socket = connected_udp(netns, to)?;
    socket.send(b"hello")?;
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf).map_err(|e| anyhow::anyhow!("no answer from {to}: {e}"))?;
    parse_seen(&buf[..n])
}

fn parse_seen(answer: &[u8]) -> Result<SocketAddr> {
    let text = String::from_utf8_lossy(answer);
    text.trim().parse().with_context(|| format!("the server answered {text:?}"))
}

/// Frames in `frames` sent by `mac` toward `ip`: IPv4 packets to it, or ARP requests for it.
pub fn frames_toward(frames: &[Vec<u8>], mac: [u8; 6], ip: Ipv4Addr) -> usize {
    let ip = ip.octets();
    frames
        .iter()
        .filter(|f| f.len() >= 42 && f[6..12] == mac)
        .filter(|f| match [f[12], f[13]] {
            [0x08, 0x00] => f[30..34] == ip,
            [0x08, 0x06] => f[38..42] == ip,
            _ => false,
        })
        .count()
}

/// A datagram from `netns` to `closed`, a port nobody listens on: succeeds only when the
/// destination's ICMP port unreachable makes it back to the sending socket (a connected UDP
/// socket reports it as `ConnectionRefused`), i.e. the error was translated and steered right.
pub fn port_unreachable(netns: &str, closed: SocketAddr) -> Result<()> {
    let socket = connected_udp(netns, closed)?;
    socket.send(b"anyone?")?;
    match socket.recv(&mut [0u8; 16]) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
        other => bail!("expected the endpoint's port unreachable, got {other:?}"),
    }
}

/// A UDP socket of `netns` on an ephemeral port, connected to `to`, reads timing out after
/// [`FLOW_TIMEOUT`].
fn connected_udp(netns: &str, to: SocketAddr) -> Result<UdpSocket> {
    let any: IpAddr = if to.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    in_netns(netns, move || {
        let socket = UdpSocket::bind(SocketAddr::new(any, 0))?;
        socket.connect(to)?;
        socket.set_read_timeout(Some(FLOW_TIMEOUT))?;
        Ok(socket)
    })
}
