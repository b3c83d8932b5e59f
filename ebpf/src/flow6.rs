//! The addresses and ports of an IPv6 packet, as NAT sees them (`flow.rs` for IPv4). Only
//! packets whose first header after IPv6 is TCP, UDP or ICMPv6 echo are translated: extension
//! headers (fragments among them) are `NatUntranslatable`.
use core::mem::MaybeUninit;

use aya_ebpf::{helpers::bpf_skb_load_bytes, programs::TcContext};
use ebpf_common::{DropReason, FAMILY_IPV6, FlowKey};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::flow::{PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

pub const PROTO_ICMPV6: u8 = 58;
const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;

pub const IP_OFFSET: usize = EthHdr::LEN;
pub const L4_OFFSET: usize = EthHdr::LEN + Ipv6Hdr::LEN;

/// One direction of a TCP, UDP or ICMPv6 echo flow: its `NAT` key as it is on the wire (ports
/// in host byte order; an echo's identifier is the request's source port and the reply's
/// destination port, as in IPv4), kept whole so that lookups use it without building a copy
/// (each copy is 40 bytes of a stack the port search needs).
#[derive(Clone, Copy)]
pub struct Flow6 {
    pub key: FlowKey,
    /// FIN, SYN, RST and ACK as in `flow::Flow::tcp_flags` (the wire's bit positions).
    pub tcp_flags: u8,
}

impl Flow6 {
    #[inline(always)]
    pub fn parse(ctx: &TcContext) -> Result<Self, DropReason> {
        // Field by field rather than whole headers: every byte loaded is a byte of stack.
        let next_header: u8 = ctx.load(IP_OFFSET + 6).map_err(|_| DropReason::Malformed)?;
        let mut tcp_flags = 0;
        let (src_port, dst_port) = match next_header {
            PROTO_TCP | PROTO_UDP => {
                let ports: [u8; 4] = ctx.load(L4_OFFSET).map_err(|_| DropReason::Malformed)?;
                if next_header == PROTO_TCP {
                    // The flags byte, in the bit positions `tcp_flags` keeps them in.
                    let flags = ctx.load::<u8>(L4_OFFSET + 13).map_err(|_| DropReason::Malformed)?;
                    tcp_flags = flags & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK);
                }
                (u16::from_be_bytes([ports[0], ports[1]]), u16::from_be_bytes([ports[2], ports[3]]))
            }
            PROTO_ICMPV6 => {
                // Type, code, checksum, identifier.
                let head: [u8; 6] = ctx.load(L4_OFFSET).map_err(|_| DropReason::Malformed)?;
                let id = u16::from_be_bytes([head[4], head[5]]);
                match head[0] {
                    ECHO_REQUEST => (id, 0),
                    ECHO_REPLY => (0, id),
                    _ => return Err(DropReason::NatUntranslatable),
                }
            }
            _ => return Err(DropReason::NatUntranslatable),
        };
        // The first word (family, protocol, ports), then both addresses straight into the key
        // (they follow each other there as in the header). Not zeroed first: the zero arrays
        // compiled to calls of a byte-by-byte `memset`, which the verifier walked in every
        // program that parses IPv6, and the helper writes all 32 bytes (zeros if it fails).
        let mut key = MaybeUninit::<FlowKey>::uninit();
        let (s, d) = (src_port.to_ne_bytes(), dst_port.to_ne_bytes());
        let head = u64::from_ne_bytes([FAMILY_IPV6, next_header, 0, 0, s[0], s[1], d[0], d[1]]);
        // SAFETY: `FlowKey` is `#[repr(C)]`, 8-aligned: family, protocol, pad and the ports are
        // its first word; `src_addr` and `dst_addr` its next 32 adjacent bytes.
        let loaded = unsafe {
            key.as_mut_ptr().cast::<u64>().write(head);
            let addresses = (&raw mut (*key.as_mut_ptr()).src_addr).cast();
            bpf_skb_load_bytes(ctx.skb.skb.cast(), (IP_OFFSET + 8) as u32, addresses, 32)
        };
        if loaded != 0 {
            return Err(DropReason::Malformed);
        }
        // SAFETY: all 40 bytes written above.
        let key = unsafe { key.assume_init() };
        Ok(Self { key, tcp_flags })
    }

    #[inline(always)]
    pub fn reply_key(&self) -> FlowKey {
        let k = &self.key;
        key(k.protocol, k.dst_addr, k.dst_port, k.src_addr, k.src_port)
    }

    /// Whether this is a TCP segment that opens a connection (SYN without ACK).
    #[inline(always)]
    pub fn opens(&self) -> bool {
        self.key.protocol == PROTO_TCP && self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    #[inline(always)]
    pub fn closes(&self) -> bool {
        self.key.protocol == PROTO_TCP && self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }

    #[inline(always)]
    pub fn resets(&self) -> bool {
        self.key.protocol == PROTO_TCP && self.tcp_flags & TCP_RST != 0
    }

    /// As `Flow::may_open`.
    #[inline(always)]
    pub fn may_open(&self) -> bool {
        match self.key.protocol {
            PROTO_TCP => self.opens(),
            PROTO_UDP => true,
            _ => self.key.dst_port == 0 && self.key.src_port != 0,
        }
    }
}

#[inline(always)]
pub fn key(protocol: u8, src: [u8; 16], src_port: u16, dst: [u8; 16], dst_port: u16) -> FlowKey {
    FlowKey { family: FAMILY_IPV6, protocol, pad: [0; 2], src_port, dst_port, src_addr: src, dst_addr: dst }
}
