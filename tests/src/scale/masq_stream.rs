//! Traffic through the masquerade path for as long as a scale run lasts: a pod asks a UDP echo
//! server in the external namespace, one question at a time, and counts the answers and the
//! longest wait for one. A datapath that a churning neighbour disturbed shows as lost answers
//! or a long silence.
use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::traffic::udp_socket;

/// What the stream saw.
#[derive(Clone, Debug, Default)]
pub struct StreamStats {
    pub asked: u64,
    pub answered: u64,
    /// The longest time between two answers.
    pub longest_silence: Duration,
    /// When each unanswered question was asked, from the stream's start.
    pub lost_at: Vec<Duration>,
    /// The sources the server saw, with when it first saw each: one flow, one translation,
    /// unless something dropped the flow's NAT entries while it ran.
    pub translations: Vec<(SocketAddr, Duration)>,
}

pub struct MasqStream {
    stop: Arc<AtomicBool>,
    client: JoinHandle<Result<StreamStats>>,
    server: JoinHandle<Result<Vec<(SocketAddr, Duration)>>>,
}

/// How long the pod waits for one answer before it asks the next question.
const PATIENCE: Duration = Duration::from_millis(500);
/// The pause between an answer and the next question (a few hundred questions a second).
const PACE: Duration = Duration::from_millis(2);

impl MasqStream {
    /// Starts the echo server on `server` in `ext_netns` and the asking pod in `pod_netns`.
    pub fn start(pod_netns: &str, ext_netns: &str, server: SocketAddrV4) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let echo = udp_socket(ext_netns, server)?;
        echo.set_read_timeout(Some(Duration::from_millis(100)))?;
        let client = udp_socket(pod_netns, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))?;
        client.set_read_timeout(Some(PATIENCE))?;
        let (stop_server, stop_client) = (stop.clone(), stop.clone());
        let server_thread = std::thread::spawn(move || serve(&echo, &stop_server));
        let client_thread = std::thread::spawn(move || ask(&client, server, &stop_client));
        Ok(Self { stop, client: client_thread, server: server_thread })
    }

    /// Stops both ends; what the pod saw.
    pub fn stop(self) -> Result<StreamStats> {
        self.stop.store(true, Ordering::Relaxed);
        let mut stats = self.client.join().map_err(|_| anyhow::anyhow!("the stream's client panicked"))??;
        stats.translations = self.server.join().map_err(|_| anyhow::anyhow!("the stream's server panicked"))??;
        Ok(stats)
    }
}

fn serve(socket: &UdpSocket, stop: &AtomicBool) -> Result<Vec<(SocketAddr, Duration)>> {
    let (mut buf, mut sources, started) = ([0u8; 64], Vec::new(), Instant::now());
    while !stop.load(Ordering::Relaxed) {
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            if !sources.iter().any(|(seen, _)| *seen == from) {
                sources.push((from, started.elapsed()));
            }
            socket.send_to(&buf[..n], from).context("echo")?;
        }
    }
    Ok(sources)
}

fn ask(socket: &UdpSocket, server: SocketAddrV4, stop: &AtomicBool) -> Result<StreamStats> {
    let mut stats = StreamStats::default();
    let started = Instant::now();
    let mut last_answer = Instant::now();
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let question = stats.asked.to_be_bytes();
        socket.send_to(&question, server).context("asking through masquerade")?;
        stats.asked += 1;
        // Answers to questions that timed out may still come: only this question's counts.
        let (asked_at, deadline) = (started.elapsed(), Instant::now() + PATIENCE);
        let mut answered = false;
        while Instant::now() < deadline {
            match socket.recv_from(&mut buf) {
                Ok((8, _)) if buf[..8] == question => {
                    answered = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if answered {
            stats.answered += 1;
            stats.longest_silence = stats.longest_silence.max(last_answer.elapsed());
            last_answer = Instant::now();
        } else {
            stats.lost_at.push(asked_at);
        }
        std::thread::sleep(PACE);
    }
    Ok(stats)
}
