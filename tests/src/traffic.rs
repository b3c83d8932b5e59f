//! Sockets in a namespace. A socket belongs to the network namespace it was created in, whatever
//! thread uses it later; so a short-lived thread enters the namespace (setns), creates the
//! socket and hands it back, and the test then drives it like any other socket.
use std::{
    fs::File,
    io::{Read, Write},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use nix::sched::{CloneFlags, setns};
use socket2::{Domain, Protocol, Socket, Type};

/// How long a test socket waits for anything.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `f` on a thread inside the named network namespace and returns its result.
pub fn in_netns<T: Send + 'static>(netns: &str, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let path = format!("/run/netns/{netns}");
    std::thread::spawn(move || {
        let ns = File::open(&path).with_context(|| format!("opening {path}"))?;
        setns(ns, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering {path}"))?;
        f()
    })
    .join()
    .map_err(|_| anyhow!("thread in {netns} panicked"))?
}

pub fn tcp_listener(netns: &str, addr: SocketAddrV4) -> Result<TcpListener> {
    in_netns(netns, move || Ok(TcpListener::bind(addr)?))
}

pub fn udp_socket(netns: &str, addr: SocketAddrV4) -> Result<UdpSocket> {
    in_netns(netns, move || {
        let socket = UdpSocket::bind(addr)?;
        socket.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(socket)
    })
}

/// A TCP connection from `netns` to `to`, from source port `from_port` (0: any), with
/// SO_REUSEADDR so several pods' tests can pick the same port.
pub fn tcp_connect(netns: &str, from_port: u16, to: impl Into<SocketAddr>) -> Result<TcpStream> {
    let to = to.into();
    in_netns(netns, move || {
        let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        let any: std::net::IpAddr =
            if to.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        socket.bind(&SocketAddr::new(any, from_port).into())?;
        socket.connect_timeout(&to.into(), SOCKET_TIMEOUT)?;
        let stream: TcpStream = socket.into();
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(stream)
    })
}

/// Asks `first` then `second` from one client port of `netns`: the kernel picks the port for
/// the first connection, the second binds to it. (A fixed port could be an earlier flow's, in
/// TIME_WAIT without SO_REUSEADDR, and then bind fails with "address in use".) Each server
/// must answer a line.
pub fn ask_twice_from_one_port(netns: &str, first: SocketAddr, second: SocketAddr) -> Result<()> {
    let mut port = 0;
    for to in [first, second] {
        let mut stream = tcp_connect(netns, port, to)?;
        port = stream.local_addr()?.port();
        stream.write_all(b"hello")?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).map_err(|e| anyhow!("{to}: connected, but no answer: {e}"))?;
        anyhow::ensure!(n > 0, "{to}: closed without an answer");
    }
    Ok(())
}

/// A raw ICMP socket: sees every ICMP packet arriving in the namespace, with its source.
pub fn icmp_listener(netns: &str) -> Result<Socket> {
    in_netns(netns, || {
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?;
        socket.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        Ok(socket)
    })
}

/// Serves `connections` TCP connections on `listener`: reads a line, answers with the address
/// the client appeared to come from. Returns those addresses in accept order.
pub fn serve_tcp(listener: TcpListener, connections: usize) -> std::thread::JoinHandle<Result<Vec<SocketAddr>>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..connections {
            let (mut stream, peer) = listener.accept()?;
            stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
            let mut buf = [0u8; 64];
            let _ = stream.read(&mut buf)?;
            stream.write_all(format!("{peer}\n").as_bytes())?;
            seen.push(peer);
        }
        Ok(seen)
    })
}

/// Sends `hello` and reads the server's answer: the address the server saw.
pub fn ask_tcp(stream: &mut TcpStream) -> Result<String> {
    stream.write_all(b"hello\n")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// Receives one datagram (or times out); returns its source and contents.
pub fn recv_udp(socket: &UdpSocket) -> Result<(SocketAddr, Vec<u8>)> {
    let mut buf = vec![0u8; 65_536];
    let (n, from) = socket.recv_from(&mut buf)?;
    Ok((from, buf[..n].to_vec()))
}

/// The source address of the next ICMP echo request the raw socket sees.
pub fn next_echo_request_source(socket: &Socket) -> Result<std::net::Ipv4Addr> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
    loop {
        let n = socket.recv(&mut buf)?;
        // SAFETY: `recv` initialised the first `n` bytes.
        let packet: Vec<u8> = buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
        let header_len = usize::from(packet.first().context("empty packet")? & 0x0f) * 4;
        if packet.get(header_len) == Some(&8) {
            return Ok(std::net::Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]));
        }
    }
}

/// Which ordered pairs of `pods` (namespace, address) cannot exchange a UDP datagram: every pod
/// binds one socket, sends one datagram to every other pod, and each socket reports the sources
/// it heard. Missing pairs are retried once (the first datagrams may wait on ARP). Empty when
/// every pod reaches every other.
pub fn unreachable_pairs(pods: &[(String, Ipv4Addr)], port: u16) -> Result<Vec<(Ipv4Addr, Ipv4Addr)>> {
    let sockets: Vec<UdpSocket> = pods
        .iter()
        .map(|(netns, ip)| {
            let socket = udp_socket(netns, SocketAddrV4::new(*ip, port))?;
            socket.set_nonblocking(true)?;
            Ok(socket)
        })
        .collect::<Result<_>>()?;
    let mut missing: Vec<(usize, usize)> =
        (0..pods.len()).flat_map(|a| (0..pods.len()).filter(move |b| *b != a).map(move |b| (a, b))).collect();
    let mut heard = std::collections::HashSet::new();
    let drain = |heard: &mut std::collections::HashSet<(usize, usize)>| {
        for (to, socket) in sockets.iter().enumerate() {
            let mut buf = [0u8; 16];
            while let Ok((_, SocketAddr::V4(src))) = socket.recv_from(&mut buf) {
                if let Some(from) = pods.iter().position(|(_, ip)| *ip == *src.ip()) {
                    heard.insert((from, to));
                }
            }
        }
    };
    for _attempt in 0..2 {
        // One sender at a time, then every queue drained: a socket's receive buffer holds only
        // a few dozen datagrams.
        for (from, socket) in sockets.iter().enumerate() {
            for (_, to) in missing.iter().filter(|(f, _)| *f == from) {
                socket.send_to(b"hello", SocketAddrV4::new(pods[*to].1, port))?;
            }
            std::thread::sleep(Duration::from_millis(10));
            drain(&mut heard);
        }
        // Delivery is sub-millisecond; the wait covers ARP and a busy machine.
        std::thread::sleep(Duration::from_millis(300));
        drain(&mut heard);
        missing.retain(|pair| !heard.contains(pair));
    }
    Ok(missing.into_iter().map(|(a, b)| (pods[a].1, pods[b].1)).collect())
}

/// A raw packet socket on `ifname` inside `netns`: sends whole Ethernet frames and sees every
/// frame the interface receives (ETH_P_ALL), without the stack in between.
pub struct PacketSocket {
    fd: std::os::fd::OwnedFd,
    ifindex: i32,
}

impl PacketSocket {
    pub fn open(netns: &str, ifname: &str) -> Result<Self> {
        let name = std::ffi::CString::new(ifname)?;
        in_netns(netns, move || {
            // SAFETY: plain syscalls; the descriptor is owned at once.
            let (fd, ifindex) = unsafe {
                let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, ETH_P_ALL.to_be() as i32);
                anyhow::ensure!(raw >= 0, "packet socket: {}", std::io::Error::last_os_error());
                (std::os::fd::FromRawFd::from_raw_fd(raw), libc::if_nametoindex(name.as_ptr()) as i32)
            };
            anyhow::ensure!(ifindex > 0, "no interface {name:?}");
            let socket = Self { fd, ifindex };
            let addr = socket.address(&[0; 6]);
            // SAFETY: `addr` is a valid sockaddr_ll for the call.
            let bound = unsafe {
                libc::bind(
                    std::os::fd::AsRawFd::as_raw_fd(&socket.fd),
                    (&raw const addr).cast(),
                    size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            anyhow::ensure!(bound == 0, "bind: {}", std::io::Error::last_os_error());
            Ok(socket)
        })
    }

    fn address(&self, dst: &[u8; 6]) -> libc::sockaddr_ll {
        // SAFETY: plain data, zero is valid.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_ALL.to_be();
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(dst);
        addr
    }

    /// Sends `frame` as it is (its first six bytes are the destination MAC).
    pub fn send(&self, frame: &[u8]) -> Result<()> {
        let dst: [u8; 6] = frame.get(..6).context("frame shorter than a MAC")?.try_into()?;
        let addr = self.address(&dst);
        // SAFETY: buffer and address are valid for the call.
        let sent = unsafe {
            libc::sendto(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        anyhow::ensure!(sent == frame.len() as isize, "sendto: {}", std::io::Error::last_os_error());
        Ok(())
    }

    /// Every frame received since the last call (waits briefly for frames in flight).
    pub fn received(&self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(200));
        let mut frames = Vec::new();
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: `buf` is valid for its length.
            let n =
                unsafe { libc::recv(std::os::fd::AsRawFd::as_raw_fd(&self.fd), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                return frames;
            }
            frames.push(buf[..n as usize].to_vec());
        }
    }
}

const ETH_P_ALL: u16 = 0x0003;
