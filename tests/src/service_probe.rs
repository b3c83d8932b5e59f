//! Clients and servers for the Service tests (issue 25): python3 clients started in a cgroup of
//! the test's own and a pod's namespace (the socket LB translates what the cgroup's processes
//! connect), one JSON line per result; and servers in a pod that answer with a tag, so a test
//! sees which backend answered.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, UdpSocket},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use serde_json::Value;

use crate::{cgroup::TestCgroup, lan::LanPod, traffic::in_netns};

pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;

/// The client: one mode per argument list, one JSON line per result. A host with a colon gets an
/// `AF_INET6` socket with `IPV6_V6ONLY` off, so `::ffff:<IPv4>` dials IPv4 through it.
pub const CLIENT: &str = r#"
import json, socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if ':' in host else socket.AF_INET
def out(**kw): print(json.dumps(kw), flush=True)
def peer(s): a = s.getpeername(); return "[%s]:%d" % a[:2] if fam == socket.AF_INET6 else "%s:%d" % a[:2]
def fmt(a): return "[%s]:%d" % a[:2] if fam == socket.AF_INET6 else "%s:%d" % a[:2]
def mk(kind):
    # Dual-stack, as Java and other runtimes open theirs: ::ffff:<IPv4> reaches IPv4.
    s = socket.socket(fam, kind)
    if fam == socket.AF_INET6: s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return s
t = time.monotonic()
try:
    if mode in ("tcp", "tcp-hold"):
        s = mk(socket.SOCK_STREAM); s.settimeout(3)
        s.connect((host, port)); s.sendall(b"q")
        out(peer=peer(s), reply=s.recv(64).decode())
        if mode == "tcp-hold":
            s.settimeout(20); t = time.monotonic()
            try: d = s.recv(64); out(ended="eof" if not d else "data", ms=(time.monotonic() - t) * 1000)
            except OSError as e: out(ended=e.errno, ms=(time.monotonic() - t) * 1000)
    elif mode == "udp":
        s = mk(socket.SOCK_DGRAM); s.settimeout(0.2); s.connect((host, port))
        for _ in range(int(sys.argv[4])):
            try: s.send(b"q"); out(peer=peer(s), reply=s.recv(64).decode())
            except socket.timeout: out(timeout=True)
            except OSError as e: out(error=e.errno)
            time.sleep(float(sys.argv[5]))
    elif mode == "tcp-loop":
        # A new connection a request, every argv[5] s, argv[4] times; a failed one is tried
        # once more at once (what a client's retry would do), and fails only if that does too.
        for _ in range(int(sys.argv[4])):
            t, tries = time.monotonic(), 0
            while True:
                s = mk(socket.SOCK_STREAM); s.settimeout(1)
                try:
                    s.connect((host, port)); s.sendall(b"q"); r = s.recv(64).decode()
                    if not r: raise OSError(0, "closed without a reply")
                    out(t=t, reply=r, retries=tries); break
                except OSError as e:
                    tries += 1
                    if tries > 1: out(t=t, error=e.errno, retries=tries); break
                finally: s.close()
            time.sleep(float(sys.argv[5]))
    elif mode == "udp-unconnected":
        s = mk(socket.SOCK_DGRAM); s.settimeout(2); s.sendto(b"q", (host, port))
        d, a = s.recvfrom(64); out(source=fmt(a), reply=d.decode())
except OSError as e:
    out(error=e.errno, ms=(time.monotonic() - t) * 1000)
"#;

/// A client process in the cgroup and `pod`'s namespace; its result lines on a channel.
pub struct Client {
    pub child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Client {
    pub fn start(cgroup: &TestCgroup, pod: &LanPod, args: &[&str]) -> Self {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net=/run/netns/{}", pod.netns)).args(["python3", "-c", CLIENT]).args(args);
        command.stdout(Stdio::piped()).stdin(Stdio::null());
        cgroup.confine(&mut command).unwrap();
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::String(line)));
            }
        });
        Self { child, lines }
    }

    pub fn next(&self, within: Duration) -> Value {
        self.try_next(within).unwrap_or_else(|| panic!("no result from the client within {within:?}"))
    }

    /// The client's next result, if one comes within `within`.
    pub fn try_next(&self, within: Duration) -> Option<Value> {
        self.lines.recv_timeout(within).ok()
    }

    /// Runs a one-shot client to its single result.
    pub fn once(cgroup: &TestCgroup, pod: &LanPod, args: &[&str]) -> Value {
        let mut client = Self::start(cgroup, pod, args);
        let result = client.next(Duration::from_secs(5));
        let _ = client.child.wait();
        result
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Our own child, by its PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TCP and UDP servers in a pod answering every request with `tag` (which backend answered);
/// TCP connections stay open until the client closes them.
pub struct Tagged {
    stop: Arc<AtomicBool>,
}

impl Tagged {
    pub fn start(netns: &str, tag: &'static str) -> Self {
        Self::on_ports(netns, tag, TCP_PORT, UDP_PORT)
    }

    /// Like [`Self::start`], on other ports (beside servers already on the usual ones).
    pub fn on_ports(netns: &str, tag: &'static str, tcp_port: u16, udp_port: u16) -> Self {
        Self::serve(netns, tag, tcp_port, udp_port, false)
    }

    /// Like [`Self::start`], answering `<tag> <the client's address as seen>`: which backend,
    /// and whether the client's source was kept or translated on the way.
    pub fn naming_peers(netns: &str, tag: &'static str) -> Self {
        Self::serve(netns, tag, TCP_PORT, UDP_PORT, true)
    }

    fn serve(netns: &str, tag: &'static str, tcp_port: u16, udp_port: u16, name_peer: bool) -> Self {
        // An IPv4 peer of the dual-stack sockets shows as itself (`to_canonical`).
        let answer = move |peer: std::net::SocketAddr| {
            if name_peer { format!("{tag} {}", peer.ip().to_canonical()) } else { tag.to_string() }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let tcp: TcpListener = in_netns(netns, move || Ok(TcpListener::bind(("::", tcp_port))?)).unwrap();
        let udp: UdpSocket = in_netns(netns, move || Ok(UdpSocket::bind(("::", udp_port))?)).unwrap();
        tcp.set_nonblocking(true).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let halt = stop.clone();
        std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut stream, peer)) => drop(std::thread::spawn(move || {
                        let _ = stream.set_nonblocking(false);
                        let mut buf = [0u8; 64];
                        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {
                            let _ = stream.write_all(answer(peer).as_bytes());
                        }
                    })),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        let halt = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !halt.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(answer(peer).as_bytes(), peer);
                }
            }
        });
        Self { stop }
    }
}

impl Drop for Tagged {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One request on a held TCP connection to a `Tagged` server: the answer, or the error's errno
/// (0: closed by the peer) and how long it took.
pub fn ask(stream: &mut std::net::TcpStream) -> Result<String, (i32, Duration)> {
    let started = std::time::Instant::now();
    let errno = |e: std::io::Error| (e.raw_os_error().unwrap_or(-1), started.elapsed());
    stream.write_all(b"q").map_err(errno)?;
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => Err((0, started.elapsed())),
        Ok(n) => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) => Err(errno(e)),
    }
}
