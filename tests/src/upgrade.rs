//! What the upgrade tests share: an earlier release's binary, from the variable `cargo xtask
//! test` sets, and the traffic that runs across an upgrade (pings to the outside, a long TCP
//! connection, a masqueraded UDP flow), each reporting what it lost.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream, UdpSocket},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

use crate::{EXT_SERVER, Plugin, traffic};

/// The pings of the upgrade window: one every 50 ms for 3 s, longer than the upgrade's steps.
pub const PINGS: u32 = 60;
/// The long TCP connection exchanges a message this often.
pub const TCP_EVERY: Duration = Duration::from_millis(20);

/// The release binary `var` names, or `None` (then the test is skipped, except under CI).
pub fn release_plugin(var: &str, test: &str) -> Option<Plugin> {
    match std::env::var_os(var) {
        Some(path) => Some(Plugin { binary: PathBuf::from(path) }),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: {var} is not set (`cargo xtask test` builds it) and CI=true forbids skipping")
        }
        None => {
            eprintln!("SKIPPED {test}: {var} is not set (`cargo xtask test` builds it)");
            None
        }
    }
}

/// A ping every 50 ms from `netns` to `to`, `PINGS` of them, run in the background.
pub fn start_pings(netns: &str, to: &str) -> Result<Child> {
    let count = PINGS.to_string();
    Command::new("ip")
        .args(["netns", "exec", netns, "ping", "-q", "-n", "-i", "0.05", "-W", "1", "-c", &count, to])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting ping")
}

/// Waits for the pings and returns (sent, answered) from ping's summary.
pub fn finish_pings(ping: Child) -> Result<(u32, u32)> {
    let out = ping.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("packets transmitted")).context("no ping summary")?;
    let numbers: Vec<u32> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    ensure!(numbers.len() >= 2, "unreadable ping summary: {line}");
    Ok((numbers[0], numbers[1]))
}

/// Segments the connection's sender had to send again: any is a segment lost on the way.
fn retransmitted(stream: &TcpStream) -> Result<u32> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: an all-zero `tcp_info` is valid; the kernel fills at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket and a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &mut len)
    };
    ensure!(rc == 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    Ok(info.tcpi_total_retrans)
}

/// An echo server in the external namespace and one connection to it from `netns`, exchanging
/// a message every [`TCP_EVERY`] until `stop`; the thread returns how many exchanges completed
/// and how many segments the client retransmitted.
pub fn start_tcp_conversation(netns: &str, ext: &str, stop: Arc<AtomicBool>) -> Result<JoinHandle<Result<(u32, u32)>>> {
    let at = SocketAddrV4::new(EXT_SERVER.parse()?, 7007);
    let listener = traffic::tcp_listener(ext, at)?;
    std::thread::spawn(move || -> Result<()> {
        let (mut stream, _) = listener.accept()?;
        let mut buf = [0u8; 16];
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n])?;
        }
    });
    let mut stream: TcpStream = traffic::tcp_connect(netns, 0, at)?;
    Ok(std::thread::spawn(move || {
        let mut exchanges = 0u32;
        while !stop.load(Ordering::Relaxed) {
            stream.write_all(b"still there?")?;
            let mut buf = [0u8; 12];
            stream.read_exact(&mut buf).context("the long TCP connection stopped answering")?;
            exchanges += 1;
            std::thread::sleep(TCP_EVERY);
        }
        Ok((exchanges, retransmitted(&stream)?))
    }))
}

/// A UDP flow from a pod to the external server (port 5353), masqueraded on the way out.
pub struct UdpFlow {
    client: UdpSocket,
    server: UdpSocket,
}

impl UdpFlow {
    pub fn open(netns: &str, ext: &str) -> Result<Self> {
        let at = SocketAddrV4::new(EXT_SERVER.parse()?, 5353);
        let server = traffic::udp_socket(ext, at)?;
        let client = traffic::udp_socket(netns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        client.connect(at)?;
        Ok(Self { client, server })
    }

    /// One request and its answer; returns the source the server saw (the masquerade's).
    pub fn exchange(&self) -> std::net::SocketAddr {
        self.client.send(b"ping").unwrap();
        let (from, _) = traffic::recv_udp(&self.server).unwrap();
        self.server.send_to(b"pong", from).unwrap();
        let mut buf = [0u8; 8];
        let n = self.client.recv(&mut buf).expect("the flow opened before the upgrade lost its replies");
        assert_eq!(&buf[..n], b"pong");
        from
    }
}

/// The first address of an ADD result, without its prefix length.
pub fn address(result: &Value) -> String {
    let cidr = result["ips"][0]["address"].as_str().unwrap_or_default();
    cidr.split('/').next().unwrap_or_default().to_string()
}
