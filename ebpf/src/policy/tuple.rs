//! A packet's 5-tuple as `POLICY_FLOWS` keys it (`FlowKey`, ports in host byte order). Unlike
//! NAT's (`flow.rs`), every protocol has one: SCTP's ports sit where TCP's and UDP's do; ICMP
//! echo has its identifier as NAT keys it (request: source port, reply: destination port);
//! anything else, and a later fragment, has ports 0 (rules with ports never allow it).
use aya_ebpf::{helpers::bpf_skb_load_bytes, programs::TcContext};
use ebpf_common::{FAMILY_IPV4, FAMILY_IPV6, FlowKey};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::{Ipv4Hdr, Ipv6Hdr},
};

use crate::flow::{PROTO_ICMP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

const PROTO_SCTP: u8 = 132;
const PROTO_ICMPV6: u8 = 58;
const FRAGMENT_OFFSET: u16 = 0x1fff;

pub struct Tuple {
    pub key: FlowKey,
    /// FIN, SYN, RST, ACK in the wire's bit positions; 0 for other protocols.
    pub tcp_flags: u8,
}

impl Tuple {
    /// A TCP segment that opens a connection: SYN without ACK.
    #[inline(always)]
    pub fn opens(&self) -> bool {
        self.key.protocol == PROTO_TCP && self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// A TCP segment of a connection already open (no SYN without ACK): with no cached verdict,
    /// it may be a reply.
    #[inline(always)]
    pub fn mid_stream(&self) -> bool {
        self.key.protocol == PROTO_TCP && !self.opens()
    }

    #[inline(always)]
    pub fn closes(&self) -> bool {
        self.key.protocol == PROTO_TCP && self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }

    /// Turns the key into the other direction's (twice: back).
    #[inline(always)]
    pub fn turn(&mut self) {
        let k = &mut self.key;
        core::mem::swap(&mut k.src_port, &mut k.dst_port);
        core::mem::swap(&mut k.src_addr, &mut k.dst_addr);
    }
}

/// The tuple of an IPv4 or IPv6 packet; `None` for anything else, a truncated header, and
/// ICMPv6 neighbour discovery.
#[inline(always)]
pub fn parse(ctx: &TcContext) -> Option<Tuple> {
    let ether_type: u16 = ctx.load(core::mem::offset_of!(EthHdr, ether_type)).ok()?;
    let mut key =
        FlowKey { family: 0, protocol: 0, pad: [0; 2], src_port: 0, dst_port: 0, src_addr: [0; 16], dst_addr: [0; 16] };
    let l4 = if ether_type == EtherType::Ipv4 as u16 {
        let ip: Ipv4Hdr = ctx.load(EthHdr::LEN).ok()?;
        key.family = FAMILY_IPV4;
        key.protocol = ip.proto;
        key.src_addr[..4].copy_from_slice(&ip.src_addr);
        key.dst_addr[..4].copy_from_slice(&ip.dst_addr);
        if u16::from_be_bytes(ip.frags) & FRAGMENT_OFFSET != 0 {
            return Some(Tuple { key, tcp_flags: 0 });
        }
        EthHdr::LEN + usize::from(ip.ihl())
    } else if ether_type == EtherType::Ipv6 as u16 {
        key.family = FAMILY_IPV6;
        key.protocol = ctx.load(EthHdr::LEN + 6).ok()?;
        let addresses: *mut [u8; 16] = &mut key.src_addr;
        // SAFETY: `src_addr` and `dst_addr` are 32 adjacent bytes of `key` (`#[repr(C)]`).
        let loaded = unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), (EthHdr::LEN + 8) as u32, addresses.cast(), 32) };
        if loaded != 0 {
            return None;
        }
        EthHdr::LEN + Ipv6Hdr::LEN
    } else {
        return None;
    };
    let mut tcp_flags = 0;
    match key.protocol {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => {
            let ports: [u8; 4] = ctx.load(l4).ok()?;
            key.src_port = u16::from_be_bytes([ports[0], ports[1]]);
            key.dst_port = u16::from_be_bytes([ports[2], ports[3]]);
            if key.protocol == PROTO_TCP {
                let flags: u8 = ctx.load(l4 + 13).ok()?;
                tcp_flags = flags & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK);
            }
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            // Type, code, checksum, identifier.
            let head: [u8; 6] = ctx.load(l4).ok()?;
            let id = u16::from_be_bytes([head[4], head[5]]);
            // Neighbour discovery and MLD stay on the link, never a policy's business.
            if key.protocol == PROTO_ICMPV6 && head[0] >= 130 && head[0] <= 143 {
                return None;
            }
            match (key.protocol, head[0]) {
                (PROTO_ICMP, 8) | (PROTO_ICMPV6, 128) => key.src_port = id,
                (PROTO_ICMP, 0) | (PROTO_ICMPV6, 129) => key.dst_port = id,
                _ => {}
            }
        }
        _ => {}
    }
    Some(Tuple { key, tcp_flags })
}
