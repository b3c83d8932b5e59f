//! Incremental checksum updates for ICMP errors, whose message quotes a packet: every change
//! inside the quote moves both the quoted header's checksum and the ICMP checksum around it
//! (`icmp_error.rs`, `icmp_error6.rs`).
use aya_ebpf::programs::TcContext;
use ebpf_common::DropReason;

#[inline(always)]
pub fn store<const N: usize>(ctx: &TcContext, at: usize, bytes: &[u8; N]) -> Result<(), DropReason> {
    ctx.store(at, bytes, 0).map_err(|_| DropReason::Malformed)
}

/// Updates the checksum at `at` for data that changed by `delta`, and records in `outer` how the
/// checksum field itself changed (it lies inside the ICMP message).
#[inline(always)]
pub fn update_checksum(ctx: &TcContext, at: usize, delta: Delta, outer: &mut Delta) -> Result<(), DropReason> {
    let old: [u8; 2] = ctx.load(at).map_err(|_| DropReason::Malformed)?;
    let new = delta.applied_to(old);
    store(ctx, at, &new)?;
    outer.add(Delta::of(&old, &new));
    Ok(())
}

/// How a one's-complement sum changes: the sum of the new 16-bit words minus the old (RFC 1624).
#[derive(Clone, Copy, Default)]
pub struct Delta(u32);

impl Delta {
    #[inline(always)]
    pub fn of<const N: usize>(old: &[u8; N], new: &[u8; N]) -> Self {
        let mut sum = 0u32;
        let mut i = 0;
        while i + 1 < N {
            sum += u32::from(!u16::from_be_bytes([old[i], old[i + 1]]));
            sum += u32::from(u16::from_be_bytes([new[i], new[i + 1]]));
            i += 2;
        }
        Self(sum)
    }

    /// [`Delta::of`] two IPv6 addresses, in a BPF function of its own: inlined, its 32 byte
    /// loads, scheduled all at once, spill over the caller's stack frame (`service/icmp_error6.rs`
    /// computes five such deltas).
    #[inline(never)]
    pub fn of_addresses(old: &[u8; 16], new: &[u8; 16]) -> Self {
        Self::of(old, new)
    }

    #[inline(always)]
    pub fn add(&mut self, other: Delta) {
        self.0 = fold(self.0 + other.0);
    }

    #[inline(always)]
    pub fn plus(self, other: Delta) -> Delta {
        Delta(fold(self.0 + other.0))
    }

    /// A checksum field (the complement of the sum) after its data changed by this delta.
    #[inline(always)]
    pub fn applied_to(self, checksum: [u8; 2]) -> [u8; 2] {
        let sum = u32::from(!u16::from_be_bytes(checksum)) + self.0;
        (!(fold(sum) as u16)).to_be_bytes()
    }

    #[inline(always)]
    pub fn apply(self, ctx: &TcContext, at: usize) -> Result<(), DropReason> {
        let old: [u8; 2] = ctx.load(at).map_err(|_| DropReason::Malformed)?;
        store(ctx, at, &self.applied_to(old))
    }
}

#[inline(always)]
fn fold(mut sum: u32) -> u32 {
    sum = (sum & 0xffff) + (sum >> 16);
    (sum & 0xffff) + (sum >> 16)
}
