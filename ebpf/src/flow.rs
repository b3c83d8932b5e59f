//! The addresses and ports of an IPv4 packet, as NAT sees them. Read with `bpf_skb_load_bytes`
//! (`TcContext::load`), which works whatever part of the packet is in the linear area.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DropReason, FAMILY_IPV4, FlowKey, ipv4_in_16};
use network_types::{
    eth::{EthHdr, EtherType},
    icmp::Icmpv4Hdr,
    ip::Ipv4Hdr,
    tcp::TcpHdr,
    udp::UdpHdr,
};

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_ECHO_REQUEST: u8 = 8;
/// More-fragments flag and fragment offset: any of them set means this is a fragment.
pub const FRAGMENT_BITS: u16 = 0x3fff;
pub const MORE_FRAGMENTS: u16 = 0x2000;
const FRAGMENT_OFFSET: u16 = 0x1fff;

/// Where things are in an Ethernet + IPv4 frame.
pub const IP_OFFSET: usize = EthHdr::LEN;

/// One direction of a TCP, UDP or ICMP echo flow. Ports in host byte order.
#[derive(Clone, Copy)]
pub struct Flow {
    pub protocol: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
    /// Offset of the L4 header in the frame.
    pub l4: usize,
    /// TCP's flags byte (FIN 0x01, SYN 0x02, RST 0x04, …), 0 for other protocols.
    pub tcp_flags: u8,
    /// The first fragment of a fragmented datagram: the later ones carry no ports and are
    /// translated by the IPv4 identification `ip_id` (`fragments.rs`).
    pub first_fragment: bool,
    pub ip_id: u16,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

impl Flow {
    /// Reads the flow of an IPv4 packet. Fragments other than the first, ICMP other than echo
    /// and other protocols have no ports to translate: `NatUntranslatable`.
    #[inline(always)]
    pub fn parse(ctx: &TcContext) -> Result<Self, DropReason> {
        let ip: Ipv4Hdr = ctx.load(IP_OFFSET).map_err(|_| DropReason::Malformed)?;
        let header_len = usize::from(ip.ihl());
        if header_len < Ipv4Hdr::LEN {
            return Err(DropReason::Malformed);
        }
        let frags = u16::from_be_bytes(ip.frags);
        if frags & FRAGMENT_OFFSET != 0 {
            return Err(DropReason::NatUntranslatable);
        }
        let l4 = IP_OFFSET + header_len;
        let mut tcp_flags = 0;
        let (src_port, dst_port) = match ip.proto {
            PROTO_TCP => {
                let tcp: TcpHdr = ctx.load(l4).map_err(|_| DropReason::Malformed)?;
                // FIN, SYN, RST and ACK into the wire's bit positions.
                tcp_flags = (tcp.fin() | tcp.syn() << 1 | tcp.rst() << 2 | tcp.ack() << 4) as u8;
                (u16::from_be_bytes(tcp.source), u16::from_be_bytes(tcp.dest))
            }
            PROTO_UDP => {
                let udp: UdpHdr = ctx.load(l4).map_err(|_| DropReason::Malformed)?;
                (u16::from_be_bytes(udp.src), u16::from_be_bytes(udp.dst))
            }
            PROTO_ICMP => {
                let icmp: Icmpv4Hdr = ctx.load(l4).map_err(|_| DropReason::Malformed)?;
                let id = u16::from_be_bytes([icmp.data[0], icmp.data[1]]);
                match icmp.type_ {
                    ICMP_ECHO_REQUEST => (id, 0),
                    ICMP_ECHO_REPLY => (0, id),
                    _ => return Err(DropReason::NatUntranslatable),
                }
            }
            _ => return Err(DropReason::NatUntranslatable),
        };
        Ok(Self {
            protocol: ip.proto,
            src: ip.src_addr,
            dst: ip.dst_addr,
            src_port,
            dst_port,
            l4,
            tcp_flags,
            first_fragment: frags & MORE_FRAGMENTS != 0,
            ip_id: u16::from_be_bytes(ip.id),
        })
    }

    /// The key of this packet as it is on the wire.
    #[inline(always)]
    pub fn key(&self) -> FlowKey {
        key(self.protocol, self.src, self.src_port, self.dst, self.dst_port)
    }

    /// The key its replies will have: addresses and ports swapped (an echo request's
    /// identifier becomes the reply's destination "port", as in `parse`).
    #[inline(always)]
    pub fn reply_key(&self) -> FlowKey {
        key(self.protocol, self.dst, self.dst_port, self.src, self.src_port)
    }

    /// Whether this is a TCP segment that opens a connection (SYN without ACK).
    #[inline(always)]
    pub fn opens(&self) -> bool {
        self.protocol == PROTO_TCP && self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// Whether this is a TCP segment that ends its connection (FIN or RST).
    #[inline(always)]
    pub fn closes(&self) -> bool {
        self.protocol == PROTO_TCP && self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }

    /// Whether this is a TCP reset.
    #[inline(always)]
    pub fn resets(&self) -> bool {
        self.protocol == PROTO_TCP && self.tcp_flags & TCP_RST != 0
    }

    /// Whether this packet may open a flow towards its destination: a TCP SYN without ACK, a
    /// UDP datagram, an echo request (identifier as source port, 0 as destination).
    #[inline(always)]
    pub fn may_open(&self) -> bool {
        match self.protocol {
            PROTO_TCP => self.opens(),
            PROTO_UDP => true,
            _ => self.dst_port == 0 && self.src_port != 0,
        }
    }
}

#[inline(always)]
pub fn key(protocol: u8, src: [u8; 4], src_port: u16, dst: [u8; 4], dst_port: u16) -> FlowKey {
    FlowKey {
        family: FAMILY_IPV4,
        protocol,
        pad: [0; 2],
        src_port,
        dst_port,
        src_addr: ipv4_in_16(src),
        dst_addr: ipv4_in_16(dst),
    }
}

#[inline(always)]
pub fn v4_from_16(a: [u8; 16]) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}

#[inline(always)]
pub fn is_ipv4(ctx: &TcContext) -> bool {
    let at = core::mem::offset_of!(EthHdr, ether_type);
    ctx.load::<u16>(at).is_ok_and(|t| t == EtherType::Ipv4 as u16)
}

#[inline(always)]
pub fn is_ipv6(ctx: &TcContext) -> bool {
    let at = core::mem::offset_of!(EthHdr, ether_type);
    ctx.load::<u16>(at).is_ok_and(|t| t == EtherType::Ipv6 as u16)
}

/// Source and destination address of an IPv4 packet.
#[inline(always)]
pub fn addresses(ctx: &TcContext) -> Result<([u8; 4], [u8; 4]), DropReason> {
    let at = IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, src_addr);
    let both: [u8; 8] = ctx.load(at).map_err(|_| DropReason::Malformed)?;
    Ok(([both[0], both[1], both[2], both[3]], [both[4], both[5], both[6], both[7]]))
}
