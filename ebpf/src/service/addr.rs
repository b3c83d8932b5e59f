//! The address a `sock_addr` program sees (`user_ip4`/`user_ip6`, `user_port`): the destination
//! of connect and sendmsg, the source of a received datagram, the peer getpeername reports.
//! Read and written by 32-bit words, volatile: the verifier accepts only word-sized access to
//! these fields, and a copy the compiler merged into wider loads would be refused.
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::programs::SockAddrContext;
use ebpf_common::{Backend, FAMILY_IPV4, ipv4_in_16};

#[inline(always)]
pub fn read(ctx: &SockAddrContext, family: u8) -> Backend {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context, valid while the program runs.
    unsafe {
        let port = u16::from_be(read_volatile(addr_of!((*sa).user_port)) as u16);
        let addr = if family == FAMILY_IPV4 {
            ipv4_in_16(read_volatile(addr_of!((*sa).user_ip4)).to_ne_bytes())
        } else {
            let words = [
                read_volatile(addr_of!((*sa).user_ip6[0])),
                read_volatile(addr_of!((*sa).user_ip6[1])),
                read_volatile(addr_of!((*sa).user_ip6[2])),
                read_volatile(addr_of!((*sa).user_ip6[3])),
            ];
            // Same bytes: each word holds its four address bytes in network order.
            core::mem::transmute::<[u32; 4], [u8; 16]>(words)
        };
        Backend { addr, port, family, pad: 0 }
    }
}

/// Writes `to` as an address of `family`, the program's own (a constant where inlined): a
/// `*4` program may not even name the IPv6 fields, so the choice cannot come from a map.
#[inline(always)]
pub fn write(ctx: &SockAddrContext, family: u8, to: &Backend) {
    let sa = ctx.sock_addr;
    let a = &to.addr;
    let word = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    // SAFETY: as in `read`; these fields are writable for the hooks that call this.
    unsafe {
        if family == FAMILY_IPV4 {
            write_volatile(addr_of_mut!((*sa).user_ip4), word(0));
        } else {
            write_volatile(addr_of_mut!((*sa).user_ip6[0]), word(0));
            write_volatile(addr_of_mut!((*sa).user_ip6[1]), word(4));
            write_volatile(addr_of_mut!((*sa).user_ip6[2]), word(8));
            write_volatile(addr_of_mut!((*sa).user_ip6[3]), word(12));
        }
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(to.port.to_be()));
    }
}
