//! Frames written by hand, for tests that send them from a pod through a packet socket.
use std::net::Ipv4Addr;

pub fn ethernet(dst: [u8; 6], src: [u8; 6], ether_type: u16) -> Vec<u8> {
    [&dst[..], &src[..], &ether_type.to_be_bytes()[..]].concat()
}

/// A UDP datagram from port 4000 to port 4000 carrying `payload` in an IPv4 packet (checksums
/// left zero: the programs do not look at them).
pub fn ipv4_udp(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = (20 + 8 + payload.len()) as u16;
    let udp_len = (8 + payload.len()) as u16;
    [
        &[0x45, 0][..],
        &total.to_be_bytes(),
        &[0, 1, 0, 0, 64, 17, 0, 0],
        &src.octets(),
        &dst.octets(),
        &4000u16.to_be_bytes(),
        &4000u16.to_be_bytes(),
        &udp_len.to_be_bytes(),
        &[0, 0],
        payload,
    ]
    .concat()
}

/// The Internet checksum (RFC 1071) of `bytes`, folded and complemented.
pub fn checksum(bytes: &[u8]) -> u16 {
    let sum = bytes.chunks(2).fold(0u32, |acc, w| acc + u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])));
    let folded = (sum & 0xffff) + (sum >> 16);
    !(((folded & 0xffff) + (folded >> 16)) as u16)
}

/// Where an Ethernet + IPv4 frame's L4 checksum sits, and the bytes it covers (with the
/// pseudo-header for TCP and UDP).
fn l4_checksum_scope(frame: &[u8]) -> (usize, Vec<u8>) {
    let ip = &frame[14..];
    let header_len = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let l4 = &ip[header_len..total];
    let at = 14
        + header_len
        + match ip[9] {
            6 => 16,
            17 => 6,
            _ => 2,
        };
    if ip[9] == 1 {
        return (at, l4.to_vec());
    }
    let pseudo = [&ip[12..20], &[0, ip[9]], &(l4.len() as u16).to_be_bytes()[..]].concat();
    (at, [pseudo, l4.to_vec()].concat())
}

/// Fills in the IPv4 header checksum and the L4 checksum (TCP, UDP, ICMP) of an Ethernet frame.
pub fn with_checksums(mut frame: Vec<u8>) -> Vec<u8> {
    let header_len = usize::from(frame[14] & 0x0f) * 4;
    frame[24..26].fill(0);
    let sum = checksum(&frame[14..14 + header_len]);
    frame[24..26].copy_from_slice(&sum.to_be_bytes());
    let (at, _) = l4_checksum_scope(&frame);
    frame[at..at + 2].fill(0);
    let (_, covered) = l4_checksum_scope(&frame);
    frame[at..at + 2].copy_from_slice(&checksum(&covered).to_be_bytes());
    frame
}

/// Whether both checksums of an Ethernet + IPv4 frame are right (a UDP checksum of 0, "none",
/// counts as right).
pub fn checksums_valid(frame: &[u8]) -> bool {
    let header_len = usize::from(frame[14] & 0x0f) * 4;
    let (at, covered) = l4_checksum_scope(frame);
    let udp_none = frame[23] == 17 && frame[at..at + 2] == [0, 0];
    checksum(&frame[14..14 + header_len]) == 0 && (udp_none || checksum(&covered) == 0)
}
