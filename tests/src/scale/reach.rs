//! Is every pod reachable? One raw ICMP socket in a namespace (the node's) pings every address
//! once, and hears the echo replies; those that stayed silent are asked again. One socket and
//! no process per pod: a thousand pods take a fraction of a second.
use std::{
    collections::HashSet,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddrV4},
    time::{Duration, Instant},
};

use anyhow::Result;
use socket2::{Domain, Protocol, Socket, Type};

use crate::traffic::in_netns;

const ECHO_REQUEST: u8 = 8;
const ECHO_REPLY: u8 = 0;

/// Addresses in `targets` that did not answer a ping from `netns` (each asked up to 3 times).
pub fn unanswered(netns: &str, targets: &[Ipv4Addr]) -> Result<Vec<Ipv4Addr>> {
    let socket = in_netns(netns, || Ok(Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?))?;
    socket.set_read_timeout(Some(Duration::from_millis(50)))?;
    let id = (std::process::id() & 0xffff) as u16;
    let mut answered = HashSet::new();
    for attempt in 0..3u16 {
        let waiting: Vec<(usize, Ipv4Addr)> =
            targets.iter().copied().enumerate().filter(|(_, ip)| !answered.contains(ip)).collect();
        if waiting.is_empty() {
            break;
        }
        for (n, ip) in &waiting {
            let request = echo_request(id, (*n as u16).wrapping_add(attempt << 12));
            socket.send_to(&request, &SocketAddrV4::new(*ip, 0).into())?;
            // Replies queue on one socket: hear them as they come rather than let it overflow.
            if n % 64 == 63 {
                hear(&socket, id, &mut answered, Duration::from_millis(1))?;
            }
        }
        hear(&socket, id, &mut answered, Duration::from_millis(500 * u64::from(attempt + 1)))?;
    }
    Ok(targets.iter().copied().filter(|ip| !answered.contains(ip)).collect())
}

/// Records the sources of echo replies carrying `id` until `quiet` passes without one.
fn hear(socket: &Socket, id: u16, answered: &mut HashSet<Ipv4Addr>, quiet: Duration) -> Result<()> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        let Ok(n) = socket.recv(&mut buf) else { continue };
        // SAFETY: `recv` initialised the first `n` bytes.
        let packet: Vec<u8> = buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
        let header = usize::from(packet.first().copied().unwrap_or(0) & 0x0f) * 4;
        let Some(icmp) = packet.get(header..header + 8) else { continue };
        if icmp[0] == ECHO_REPLY && u16::from_be_bytes([icmp[4], icmp[5]]) == id {
            answered.insert(Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]));
            last = Instant::now();
        }
    }
    Ok(())
}

/// An ICMP echo request with 8 bytes of payload and its checksum.
fn echo_request(id: u16, seq: u16) -> Vec<u8> {
    let mut packet = vec![ECHO_REQUEST, 0, 0, 0];
    packet.extend(id.to_be_bytes());
    packet.extend(seq.to_be_bytes());
    packet.extend(b"ebpf-cni");
    let sum = packet.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]))).sum::<u32>();
    let folded = (sum & 0xffff) + (sum >> 16);
    let checksum = !(((folded & 0xffff) + (folded >> 16)) as u16);
    packet[2..4].copy_from_slice(&checksum.to_be_bytes());
    packet
}
