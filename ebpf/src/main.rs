//! TC programs of ebpf-cni. Entry points only: each one hands the packet to a module that owns
//! one concern (`from_pod.rs`, `to_pod.rs`, `to_uplink.rs`, `from_uplink.rs`, and below them
//! `sender.rs`, `arp.rs`, `ipv6.rs`, `ndp.rs`, `deliver.rs`, `fib.rs`, `steer.rs`, `snat.rs`,
//! `rev_snat.rs`, `icmp_error.rs`, `checksum.rs`, `fragments.rs`, `node_sockets.rs`,
//! `pod_flows.rs`, `shares.rs`, `port_search.rs`; for IPv6 on the uplink `uplink6.rs`,
//! `snat6.rs`, `flow6.rs`, `rewrite6.rs`, `icmp_error6.rs`). The socket LB's cgroup programs:
//! `service/`. The benchmarks' reference program, which the plugin never loads: `floor.rs`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod arp;
#[cfg(target_arch = "bpf")]
mod checksum;
#[cfg(target_arch = "bpf")]
mod config;
#[cfg(target_arch = "bpf")]
mod deliver;
#[cfg(target_arch = "bpf")]
mod fib;
#[cfg(target_arch = "bpf")]
mod floor;
#[cfg(target_arch = "bpf")]
mod flow;
#[cfg(target_arch = "bpf")]
mod flow6;
#[cfg(target_arch = "bpf")]
mod fragments;
#[cfg(target_arch = "bpf")]
mod from_pod;
#[cfg(target_arch = "bpf")]
mod from_uplink;
#[cfg(target_arch = "bpf")]
mod icmp_error;
#[cfg(target_arch = "bpf")]
mod icmp_error6;
#[cfg(target_arch = "bpf")]
mod ipv6;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod monitor;
#[cfg(target_arch = "bpf")]
mod ndp;
#[cfg(target_arch = "bpf")]
mod node_echoes;
#[cfg(target_arch = "bpf")]
mod node_sockets;
#[cfg(target_arch = "bpf")]
mod packet;
#[cfg(target_arch = "bpf")]
mod pod_flows;
#[cfg(target_arch = "bpf")]
mod policy;
#[cfg(target_arch = "bpf")]
mod port_search;
#[cfg(target_arch = "bpf")]
mod rev_snat;
#[cfg(target_arch = "bpf")]
mod rewrite;
#[cfg(target_arch = "bpf")]
mod rewrite6;
#[cfg(target_arch = "bpf")]
mod sender;
#[cfg(target_arch = "bpf")]
mod service;
#[cfg(target_arch = "bpf")]
mod shares;
#[cfg(target_arch = "bpf")]
mod snat;
#[cfg(target_arch = "bpf")]
mod snat6;
#[cfg(target_arch = "bpf")]
mod stack_epoch;
#[cfg(target_arch = "bpf")]
mod steer;
#[cfg(target_arch = "bpf")]
mod to_pod;
#[cfg(target_arch = "bpf")]
mod to_uplink;
#[cfg(target_arch = "bpf")]
mod uplink6;

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{macros::classifier, programs::TcContext};

    /// TC ingress of every host-side veth: packets leaving a pod. Inlined into the entry point:
    /// left to itself, LLVM made it a BPF-to-BPF call, one more frame per packet.
    #[classifier]
    #[inline(always)]
    pub fn from_pod(ctx: TcContext) -> i32 {
        crate::from_pod::handle(&ctx)
    }

    /// TC egress of every host-side veth: what the node's stack delivers into a pod.
    #[classifier]
    pub fn to_pod(ctx: TcContext) -> i32 {
        crate::to_pod::egress(&ctx)
    }

    /// TC egress of the uplink: masquerade pod → outside, and flows the stack sent to other nodes.
    #[classifier]
    pub fn to_uplink(ctx: TcContext) -> i32 {
        crate::to_uplink::program(ctx)
    }

    /// TC ingress of the uplink: replies to masqueraded flows, other nodes' pods, the outside.
    #[classifier]
    pub fn from_uplink(ctx: TcContext) -> i32 {
        crate::from_uplink::ingress(&ctx)
    }

    /// TC egress of the uplink, IPv6: masquerade pod → outside.
    #[classifier]
    pub fn to_uplink6(ctx: TcContext) -> i32 {
        crate::uplink6::egress(&ctx)
    }

    /// TC ingress of the uplink, IPv6: replies to masqueraded flows, flows from the outside.
    #[classifier]
    pub fn from_uplink6(ctx: TcContext) -> i32 {
        crate::uplink6::ingress(&ctx)
    }

    /// The benchmarks' reference path (`floor.rs`): never loaded by the plugin.
    #[classifier]
    pub fn floor(ctx: TcContext) -> i32 {
        crate::floor::redirect(&ctx)
    }

    /// Per-packet Service translation from the LAN (`service/nodeport.rs`), before
    /// `from_uplink` on the uplink's ingress when the node file sets `kubeProxyReplacement`:
    /// a program of its own, so `from_uplink`'s stack and verifier budget stay as they are.
    #[classifier]
    pub fn svc_from_uplink(ctx: TcContext) -> i32 {
        crate::service::nodeport::ingress(&ctx)
    }

    /// Local backends' replies to those flows (`service/reply.rs`), before `to_uplink`.
    #[classifier]
    pub fn svc_to_uplink(ctx: TcContext) -> i32 {
        crate::service::reply::egress(&ctx)
    }

    /// `svc_from_uplink` for IPv6, before `from_uplink6` (`service/nodeport6.rs`).
    #[classifier]
    pub fn svc_from_uplink6(ctx: TcContext) -> i32 {
        crate::service::nodeport6::ingress(&ctx)
    }

    /// `svc_to_uplink` for IPv6, before `to_uplink6`.
    #[classifier]
    pub fn svc_to_uplink6(ctx: TcContext) -> i32 {
        crate::service::reply::egress6(&ctx)
    }

    /// A frontend without endpoint answers (`service/reject.rs`): reached by a tail call from
    /// `svc_from_uplink`, never attached.
    #[classifier]
    pub fn svc_reject(ctx: TcContext) -> i32 {
        crate::service::reject::program(&ctx)
    }

    /// The same for IPv6 (`service/reject6.rs`), from `svc_from_uplink6`.
    #[classifier]
    pub fn svc_reject6(ctx: TcContext) -> i32 {
        crate::service::reject6::program(&ctx)
    }

    /// The socket LB (`service/`): cgroup `sock_addr` hooks, attached at the node file's
    /// `cgroupRoot` when it sets `kubeProxyReplacement`. Programs of their own, not more code
    /// in the TC ones: each has its own 512-byte stack and verifier budget.
    mod socket_lb {
        use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
        use ebpf_common::{FAMILY_IPV4, FAMILY_IPV6, ServiceEvent};

        use crate::service::{reverse::reverse, translate::translate};

        #[cgroup_sock_addr(connect4)]
        pub fn svc_connect4(ctx: SockAddrContext) -> i32 {
            translate(&ctx, FAMILY_IPV4, ServiceEvent::Connect)
        }

        #[cgroup_sock_addr(connect6)]
        pub fn svc_connect6(ctx: SockAddrContext) -> i32 {
            translate(&ctx, FAMILY_IPV6, ServiceEvent::Connect)
        }

        #[cgroup_sock_addr(sendmsg4)]
        pub fn svc_sendmsg4(ctx: SockAddrContext) -> i32 {
            translate(&ctx, FAMILY_IPV4, ServiceEvent::Sendmsg)
        }

        #[cgroup_sock_addr(sendmsg6)]
        pub fn svc_sendmsg6(ctx: SockAddrContext) -> i32 {
            translate(&ctx, FAMILY_IPV6, ServiceEvent::Sendmsg)
        }

        #[cgroup_sock_addr(recvmsg4)]
        pub fn svc_recvmsg4(ctx: SockAddrContext) -> i32 {
            reverse(&ctx, FAMILY_IPV4, ServiceEvent::Recvmsg)
        }

        #[cgroup_sock_addr(recvmsg6)]
        pub fn svc_recvmsg6(ctx: SockAddrContext) -> i32 {
            reverse(&ctx, FAMILY_IPV6, ServiceEvent::Recvmsg)
        }

        #[cgroup_sock_addr(getpeername4)]
        pub fn svc_getpeername4(ctx: SockAddrContext) -> i32 {
            reverse(&ctx, FAMILY_IPV4, ServiceEvent::Getpeername)
        }

        #[cgroup_sock_addr(getpeername6)]
        pub fn svc_getpeername6(ctx: SockAddrContext) -> i32 {
            reverse(&ctx, FAMILY_IPV6, ServiceEvent::Getpeername)
        }
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    /// GPL-compatible: `bpf_redirect_peer` and friends are GPL-only helpers.
    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("the ebpf crate is built for the BPF target by cni-plugin's build script");
}
