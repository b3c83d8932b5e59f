//! Services at connect time (the socket LB): cgroup `sock_addr` programs rewrite a Service's
//! address to one of its backends when a socket connects or sends (`translate.rs`), and show the
//! Service again where the application reads its peer (`reverse.rs`). The flow is then plain
//! pod → pod, on the TC fast paths, with no per-packet translation. Maps in `maps.rs`, the
//! backend choice in `pick.rs`, the context's address fields in `addr.rs`.
//!
//! Per-packet translation for what does not come from a local socket (NodePort, LoadBalancer
//! IPs, externalIPs from the LAN): `nodeport.rs` (uplink ingress) and `reply.rs` (uplink
//! egress) over our own connection tracking `ct.rs`, with `frontend.rs` (which frontend, which
//! backend), `open.rs` (a new flow), `share.rs` (one client's share), `snat_port.rs` (ports
//! towards remote backends), `xlate.rs` (the rewrite) and `reject.rs` (a frontend without
//! endpoint answers), `icmp_error.rs` (ICMP errors about those flows); IPv6's `nodeport6.rs`,
//! `xlate6.rs`, `reject6.rs`, `icmp_error6.rs` (its replies out: `reply.rs` too). ClientIP
//! affinity: `affinity.rs` (the map, both kinds of client), `lan_affinity.rs` (LAN clients,
//! recorded only by flows the state machine accepted).
pub mod addr;
pub mod affinity;
pub mod ct;
pub mod frontend;
pub mod icmp_error;
pub mod icmp_error6;
pub mod lan_affinity;
pub mod maps;
pub mod nodeport;
pub mod nodeport6;
pub mod open;
pub mod pick;
pub mod reject;
pub mod reject6;
pub mod reply;
pub mod reverse;
pub mod share;
pub mod snat_port;
pub mod translate;
pub mod xlate;
pub mod xlate6;

/// Whether the frame was addressed to this host (`PACKET_HOST`): not a broadcast or multicast
/// frame, nor one for another host's MAC (a promiscuous uplink). Every node holds the same
/// external frontends; a broadcast to one would otherwise be translated by all of them, each
/// backend answering a forged source. The kernel's forwarding refuses such frames too.
#[inline(always)]
pub fn for_this_host(ctx: &aya_ebpf::programs::TcContext) -> bool {
    const PACKET_HOST: u32 = 0;
    // SAFETY: `skb` is the context pointer the kernel passed in.
    unsafe { (*ctx.skb.skb).pkt_type == PACKET_HOST }
}
