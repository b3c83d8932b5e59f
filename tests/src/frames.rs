//! Frames written by hand, for tests that send them from a pod through a packet socket.
use std::net::{Ipv4Addr, Ipv6Addr};

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

/// An IPv4 packet of protocol `proto` around `l4` (no options, not fragmented, checksums left
/// zero: see [`with_checksums`]).
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let total = (20 + l4.len()) as u16;
    [&[0x45, 0][..], &total.to_be_bytes(), &[0, 1, 0, 0, 64, proto, 0, 0], &src.octets(), &dst.octets(), l4].concat()
}

/// A TCP header without options (sequence 1, no acknowledgement number) with `flags`
/// (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10).
pub fn tcp(src_port: u16, dst_port: u16, flags: u8) -> Vec<u8> {
    let mut h = [&src_port.to_be_bytes()[..], &dst_port.to_be_bytes(), &[0, 0, 0, 1, 0, 0, 0, 0]].concat();
    h.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
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

/// An IPv6 packet carrying ICMPv6 `message` (its checksum filled in), hop limit 255 as
/// neighbour discovery requires.
pub fn ipv6_icmp(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> Vec<u8> {
    ipv6_with(src, dst, 58, 255, message)
}

/// An IPv6 packet carrying TCP (6), UDP (17) or ICMPv6 (58) `l4`, its checksum filled in.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4: &[u8]) -> Vec<u8> {
    ipv6_with(src, dst, next_header, 64, l4)
}

fn ipv6_with(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, hop_limit: u8, l4: &[u8]) -> Vec<u8> {
    let mut l4 = l4.to_vec();
    let at = l4_checksum_at(next_header);
    l4[at..at + 2].fill(0);
    let sum = checksum(&pseudo6(&src.octets(), &dst.octets(), next_header, &l4));
    l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let len = (l4.len() as u16).to_be_bytes();
    [&[0x60, 0, 0, 0][..], &len, &[next_header, hop_limit], &src.octets(), &dst.octets(), &l4].concat()
}

/// A neighbour solicitation (type 135) or advertisement (136, flags S and O) for `target`, with
/// a link-address option (source for 135, target for 136) holding `mac`.
pub fn neighbor_message(icmp_type: u8, target: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let (flags, option) = if icmp_type == 135 { (0, 1) } else { (0x60, 2) };
    [&[icmp_type, 0, 0, 0, flags, 0, 0, 0][..], &target.octets(), &[option, 1], &mac].concat()
}

/// Whether the L4 checksum (TCP, UDP or ICMPv6) of an IPv6 packet, with no extension headers,
/// starting at `ip` is right.
pub fn ipv6_checksum_valid(ip: &[u8]) -> bool {
    let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    checksum(&pseudo6(&ip[8..24], &ip[24..40], ip[6], &ip[40..40 + len])) == 0
}

/// The same for an Ethernet + IPv6 frame.
pub fn icmpv6_checksum_valid(frame: &[u8]) -> bool {
    ipv6_checksum_valid(&frame[14..])
}

fn l4_checksum_at(next_header: u8) -> usize {
    match next_header {
        6 => 16,
        17 => 6,
        _ => 2,
    }
}

/// What an IPv6 L4 checksum covers: the pseudo-header (addresses, length, next header), then
/// the L4 header and payload.
fn pseudo6(src: &[u8], dst: &[u8], next_header: u8, l4: &[u8]) -> Vec<u8> {
    [src, dst, &(l4.len() as u32).to_be_bytes(), &[0, 0, 0, next_header], l4].concat()
}
