//! ICMP errors about masqueraded flows (destination unreachable, fragmentation needed, time
//! exceeded, parameter problem) come back to the node's address and quote the packet as it left:
//! from the node's address and port. They are translated back like replies, inner header
//! included, so that the pod learns the path MTU or that the peer is gone, and handed to the
//! stack, whose conntrack relates them to the pod's flow.
//!
//! Every checksum stays right: the quoted IPv4 header's and its UDP/TCP checksum (when quoted)
//! are updated with the bytes they cover, and the ICMP checksum with every byte changed.
use aya_ebpf::programs::TcContext;
use ebpf_common::{DatapathConfig, DropReason, FlowKey, ForwardPath, IpKey};
use network_types::ip::Ipv4Hdr;

use crate::{
    checksum::{Delta, store, update_checksum},
    flow::{self, IP_OFFSET, PROTO_ICMP, PROTO_TCP, PROTO_UDP},
    maps, packet,
};

const DEST_UNREACHABLE: u8 = 3;
const TIME_EXCEEDED: u8 = 11;
const PARAMETER_PROBLEM: u8 = 12;
const ECHO_REQUEST: u8 = 8;
/// ICMP header: type, code, checksum, 4 more bytes; the quoted packet follows.
const ICMP_HEADER_LEN: usize = 8;

/// The packet an ICMP error quotes, as far as its flow goes (also read by the Service
/// programs' `service/icmp_error.rs`).
pub struct Quoted {
    /// Offset of the ICMP header, of the quoted IPv4 header and of the quoted L4 header.
    pub l4: usize,
    pub inner_at: usize,
    pub inner_l4: usize,
    pub inner: Ipv4Hdr,
    /// The quoted L4 header's first 8 bytes (all an error must quote).
    pub head: [u8; 8],
    /// Where the quoted packet keeps its source port (an echo request: its identifier).
    pub port_at: usize,
    pub src_port: u16,
    pub dst_port: u16,
}

impl Quoted {
    /// The key of the flow the error is about, in the direction the error travels: the
    /// quoted packet's reply (an echo request's identifier as the reply's destination port).
    #[inline(always)]
    pub fn reply_key(&self) -> FlowKey {
        flow::key(self.inner.proto, self.inner.dst_addr, self.dst_port, self.inner.src_addr, self.src_port)
    }
}

/// The quoted packet of an ICMP error about a TCP, UDP or echo flow; `None` for anything else.
#[inline(always)]
pub fn quoted(ctx: &TcContext) -> Option<Quoted> {
    let ip: Ipv4Hdr = ctx.load(IP_OFFSET).ok()?;
    if ip.proto != PROTO_ICMP || u16::from_be_bytes(ip.frags) & flow::FRAGMENT_BITS != 0 {
        return None;
    }
    // A header shorter than its fixed part is no header: its "options" would be read as ICMP.
    if usize::from(ip.ihl()) < Ipv4Hdr::LEN {
        return None;
    }
    let l4 = IP_OFFSET + usize::from(ip.ihl());
    if !matches!(ctx.load::<u8>(l4).ok()?, DEST_UNREACHABLE | TIME_EXCEEDED | PARAMETER_PROBLEM) {
        return None;
    }
    let inner_at = l4 + ICMP_HEADER_LEN;
    let inner: Ipv4Hdr = ctx.load(inner_at).ok()?;
    // The same for the quoted header: with IHL < 5 the "ports" would be its own addresses.
    if inner.version() != 4 || usize::from(inner.ihl()) < Ipv4Hdr::LEN {
        return None;
    }
    let inner_l4 = inner_at + usize::from(inner.ihl());
    let head: [u8; 8] = ctx.load(inner_l4).ok()?;
    let (port_at, src_port, dst_port) = match inner.proto {
        PROTO_TCP | PROTO_UDP => {
            (inner_l4, u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]))
        }
        PROTO_ICMP if head[0] == ECHO_REQUEST => (inner_l4 + 4, u16::from_be_bytes([head[4], head[5]]), 0),
        _ => return None,
    };
    Some(Quoted { l4, inner_at, inner_l4, inner, head, port_at, src_port, dst_port })
}

/// For an ICMP error a pod sends: the key of the flow it is about, to look up in `FLOWS`.
#[inline(always)]
pub fn flow_key(ctx: &TcContext) -> Option<FlowKey> {
    quoted(ctx).map(|q| q.reply_key())
}

/// Translates an ICMP error to the node back to the pod whose masqueraded flow it quotes;
/// anything else goes on to the node unchanged.
#[inline(always)]
pub fn translate(ctx: &TcContext, config: &DatapathConfig) -> i32 {
    let Some(q) = quoted(ctx) else { return packet::PASS };
    if q.inner.src_addr != config.node_ipv4 {
        return packet::PASS;
    }
    match rewrite(ctx, config, &q) {
        Ok(true) => maps::forwarded(ctx, ForwardPath::ReplyToPod, packet::PASS),
        Ok(false) => packet::PASS,
        Err(reason) => maps::drop(ctx, reason),
    }
}

#[inline(always)]
fn rewrite(ctx: &TcContext, config: &DatapathConfig, q: &Quoted) -> Result<bool, DropReason> {
    let (l4, inner_at, inner_l4, inner, quoted, port_at, src_port) =
        (q.l4, q.inner_at, q.inner_l4, &q.inner, q.head, q.port_at, q.src_port);
    // The reply's key finds the pod's address and port.
    // SAFETY: the value is copied out at once.
    let Some(entry) = (unsafe { maps::NAT.get(&q.reply_key()).copied() }) else { return Ok(false) };
    let (pod, pod_port) = (flow::v4_from_16(entry.addr), entry.port);
    // A deleted pod's flow (DEL leaves its entries to age): not for the pod that has its
    // address now.
    if maps::endpoint(&IpKey::v4(pod)).is_none_or(|e| e.owner != entry.owner) {
        return Ok(false);
    }
    let icmp_csum_at = l4 + 2;
    let mut icmp_delta = Delta::default();

    // The quoted source address, and the quoted header's checksum with it; both are in the ICMP
    // message, so the ICMP checksum sees the first change and the second undoes it.
    let addr_delta = Delta::of(&config.node_ipv4, &pod);
    store(ctx, inner_at + core::mem::offset_of!(Ipv4Hdr, src_addr), &pod)?;
    let inner_csum_at = inner_at + core::mem::offset_of!(Ipv4Hdr, check);
    update_checksum(ctx, inner_csum_at, addr_delta, &mut icmp_delta)?;
    icmp_delta.add(addr_delta);

    // The quoted source port (or echo identifier).
    let port_delta = Delta::of(&src_port.to_be_bytes(), &pod_port.to_be_bytes());
    store(ctx, port_at, &pod_port.to_be_bytes())?;
    icmp_delta.add(port_delta);
    // The quoted UDP or TCP checksum covers both (pseudo-header): updated when it was quoted
    // (TCP's is past the first 8 bytes) and, for UDP, unless 0 ("none").
    let l4_csum_at = match inner.proto {
        PROTO_UDP if quoted[6] | quoted[7] != 0 => Some(inner_l4 + 6),
        PROTO_TCP => Some(inner_l4 + 16),
        PROTO_ICMP => Some(inner_l4 + 2),
        _ => None,
    };
    if let Some(at) = l4_csum_at {
        // ICMP's own checksum has no pseudo-header.
        let covered = if inner.proto == PROTO_ICMP { port_delta } else { addr_delta.plus(port_delta) };
        // Not quoted that far: nothing to update.
        if ctx.load::<[u8; 2]>(at).is_ok() {
            update_checksum(ctx, at, covered, &mut icmp_delta)?;
        }
    }
    icmp_delta.apply(ctx, icmp_csum_at)?;

    // The outer destination, as for any reply (the ICMP checksum does not cover it).
    let (from, to) = (u64::from(u32::from_ne_bytes(config.node_ipv4)), u64::from(u32::from_ne_bytes(pod)));
    ctx.l3_csum_replace(IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, check), from, to, 4)
        .map_err(|_| DropReason::Malformed)?;
    store(ctx, IP_OFFSET + core::mem::offset_of!(Ipv4Hdr, dst_addr), &pod)?;
    Ok(true)
}
