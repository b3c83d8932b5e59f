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
