//! The address a `sock_addr` program sees (`user_ip4`/`user_ip6`, `user_port`): the destination
//! of connect and sendmsg, the source of a received datagram, the peer getpeername reports.
//! Read and written by 32-bit words, volatile: the verifier accepts only word-sized access to
//! these fields, and a copy the compiler merged into wider loads would be refused.
//!
//! An IPv4-mapped address (`::ffff:a.b.c.d`, an `AF_INET6` socket without `IPV6_V6ONLY` talking
//! IPv4) is read as the IPv4 address it carries, and an IPv4 address written into an IPv6
//! program's fields is written mapped: the Service maps and `SVC_SOCKETS` know one form of an
//! IPv4 address, whichever family of socket dials it.
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::programs::SockAddrContext;
use ebpf_common::{Backend, FAMILY_IPV4, FAMILY_IPV6, ipv4_in_16};

/// Word 2 of an IPv4-mapped address (bytes 8..12: `0, 0, 0xff, 0xff`); words 0 and 1 are zero.
const MAPPED_WORD2: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The address in the maps' form: an IPv4-mapped one as `FAMILY_IPV4`.
#[inline(always)]
pub fn read(ctx: &SockAddrContext, family: u8) -> Backend {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel's context, valid while the program runs.
    unsafe {
        let port = u16::from_be(read_volatile(addr_of!((*sa).user_port)) as u16);
        if family == FAMILY_IPV4 {
            let addr = ipv4_in_16(read_volatile(addr_of!((*sa).user_ip4)).to_ne_bytes());
            return Backend { addr, port, family, pad: 0 };
        }
        let words = [
            read_volatile(addr_of!((*sa).user_ip6[0])),
            read_volatile(addr_of!((*sa).user_ip6[1])),
            read_volatile(addr_of!((*sa).user_ip6[2])),
            read_volatile(addr_of!((*sa).user_ip6[3])),
        ];
        // Three compares of words already in registers: the native IPv6 path pays no more.
        if words[0] == 0 && words[1] == 0 && words[2] == MAPPED_WORD2 {
            return Backend { addr: ipv4_in_16(words[3].to_ne_bytes()), port, family: FAMILY_IPV4, pad: 0 };
        }
        // Same bytes: each word holds its four address bytes in network order.
        let addr = core::mem::transmute::<[u32; 4], [u8; 16]>(words);
        Backend { addr, port, family, pad: 0 }
    }
}

/// Writes `to` into the fields of `family`, the program's own (a constant where inlined): a
/// `*4` program may not even name the IPv6 fields, so the choice cannot come from a map. An
/// IPv4 `to` in an IPv6 program is written mapped (see the module's comment).
#[inline(always)]
pub fn write(ctx: &SockAddrContext, family: u8, to: &Backend) {
    let sa = ctx.sock_addr;
    let a = &to.addr;
    let word = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    // SAFETY: as in `read`; these fields are writable for the hooks that call this.
    unsafe {
        if family == FAMILY_IPV4 {
            write_volatile(addr_of_mut!((*sa).user_ip4), word(0));
        } else if to.family == FAMILY_IPV6 {
            write_volatile(addr_of_mut!((*sa).user_ip6[0]), word(0));
            write_volatile(addr_of_mut!((*sa).user_ip6[1]), word(4));
            write_volatile(addr_of_mut!((*sa).user_ip6[2]), word(8));
            write_volatile(addr_of_mut!((*sa).user_ip6[3]), word(12));
        } else {
            write_volatile(addr_of_mut!((*sa).user_ip6[0]), 0);
            write_volatile(addr_of_mut!((*sa).user_ip6[1]), 0);
            write_volatile(addr_of_mut!((*sa).user_ip6[2]), MAPPED_WORD2);
            write_volatile(addr_of_mut!((*sa).user_ip6[3]), word(0));
        }
        write_volatile(addr_of_mut!((*sa).user_port), u32::from(to.port.to_be()));
    }
}
