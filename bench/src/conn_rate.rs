//! TCP connections per second, one after another from a client namespace to a server: connect,
//! read the server's one byte until it closes, close. The server closes first, so TIME_WAIT
//! sits on its side and the client never runs out of ports.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddrV4, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use ebpf_cni_tests::traffic::{in_netns, tcp_listener};

/// The server listens on `listen`; the client dials `dial` (the same address, or a Service's).
pub fn per_second(
    client_ns: &str,
    server_ns: &str,
    listen: SocketAddrV4,
    dial: SocketAddrV4,
    seconds: u32,
) -> Result<f64> {
    crate::cpu::wait_idle()?;
    let listener = tcp_listener(server_ns, listen)?;
    let server = dial;
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(mut stream) = stream {
                    let _ = stream.write_all(b"x");
                }
            }
        })
    };
    let duration = Duration::from_secs(seconds.into());
    let rate = in_netns(client_ns, move || {
        let started = Instant::now();
        let mut connections = 0u64;
        while started.elapsed() < duration {
            let mut stream = TcpStream::connect(server).context("connecting")?;
            let mut reply = Vec::new();
            stream.read_to_end(&mut reply).context("reading the server's byte")?;
            connections += 1;
        }
        Ok(connections as f64 / started.elapsed().as_secs_f64())
    });
    // One more connection wakes the server so that it sees `stop`.
    stop.store(true, Ordering::Relaxed);
    let woken = in_netns(client_ns, move || Ok(TcpStream::connect_timeout(&server.into(), Duration::from_secs(1))));
    if matches!(woken, Ok(Ok(_))) {
        let _ = serving.join();
    }
    rate
}
