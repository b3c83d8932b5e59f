//! Runs a network's pinned programs on crafted frames (`BPF_PROG_TEST_RUN`), as if each frame
//! arrived on an interface of the node: the verdict, the frame as the program left it, and
//! the drop reason counted.
use std::{ffi::CString, time::Duration};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use ebpf_common::DropReason;
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};

use crate::{Testbed, traffic::in_netns};

pub const TC_ACT_UNSPEC: u32 = u32::MAX; // -1: leave it to the next filter and the stack
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

/// Runs the pinned program `name` on `frame` as if it arrived on `ifname` of the node; returns
/// the verdict and the frame as the program left it.
pub fn run(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>) -> (u32, Vec<u8>) {
    try_run(tb, name, ifname, frame).unwrap()
}

pub fn try_run(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>) -> anyhow::Result<(u32, Vec<u8>)> {
    try_run_arrived(tb, name, ifname, None, frame)
}

/// [`run`] for a frame the node received on `arrived_on` and the stack forwarded to `ifname`
/// (`skb->skb_iif`, what a program reads as `ingress_ifindex`).
pub fn run_arrived(tb: &Testbed, name: &str, ifname: &str, arrived_on: &str, frame: Vec<u8>) -> (u32, Vec<u8>) {
    try_run_arrived(tb, name, ifname, Some(arrived_on), frame).unwrap()
}

/// The CPUs this process may run on, for [`run_on_cpu`].
pub fn cpus() -> Vec<usize> {
    let set = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    (0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect()
}

/// [`run`] on CPU `cpu`: what the programs keep per CPU (the policy checks' scratch value, the
/// clock read kept there) is that CPU's. The calling thread is pinned to it for the call, and
/// the thread that runs the program in the node's namespace inherits that; a test run stays on
/// the CPU it starts on.
pub fn run_on_cpu(tb: &Testbed, cpu: usize, name: &str, ifname: &str, frame: Vec<u8>) -> (u32, Vec<u8>) {
    let this_thread = Pid::from_raw(0);
    let before = sched_getaffinity(this_thread).expect("sched_getaffinity");
    let mut one = CpuSet::new();
    one.set(cpu).expect("a CPU of the set's range");
    sched_setaffinity(this_thread, &one).unwrap_or_else(|e| panic!("pinning to CPU {cpu}: {e}"));
    let result = try_run(tb, name, ifname, frame);
    sched_setaffinity(this_thread, &before).expect("restoring the thread's CPUs");
    result.unwrap()
}

/// Runs the pinned program `name` on `frame` `repeat` times in a row (as arriving on `ifname`),
/// in the kernel: the verdict and the mean time of one run, the program's own cost per packet.
/// State the program writes persists from run to run, as for a flow's packets.
pub fn time(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>, repeat: u32) -> anyhow::Result<(u32, Duration)> {
    let (verdict, _, times) = run_repeated(tb, name, ifname, None, frame, repeat, 1)?;
    Ok((verdict, times[0]))
}

/// Runs the pinned program `name` on `frame` `runs` times, each run on a fresh copy of the frame
/// (one `BPF_PROG_TEST_RUN` of one repeat each): the verdict, the frame as the first run left it,
/// and each run's time. For a program that rewrites the frame: [`time`]'s repeats all run on the
/// one buffer, so from the second on they would time the rewritten frame's path instead. A run's
/// time includes the kernel's clock read around it.
pub fn time_each(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    frame: Vec<u8>,
    runs: usize,
) -> anyhow::Result<(u32, Vec<u8>, Vec<Duration>)> {
    run_repeated(tb, name, ifname, None, frame, 1, runs)
}

/// [`time_each`] for a frame that arrived on `arrived_on` (`ingress_ifindex`): a TC ingress
/// program reads the interface it runs on there.
pub fn time_each_arrived(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    arrived_on: &str,
    frame: Vec<u8>,
    runs: usize,
) -> anyhow::Result<(u32, Vec<u8>, Vec<Duration>)> {
    run_repeated(tb, name, ifname, Some(arrived_on), frame, 1, runs)
}

fn try_run_arrived(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    arrived_on: Option<&str>,
    frame: Vec<u8>,
) -> anyhow::Result<(u32, Vec<u8>)> {
    let (verdict, out, _) = run_repeated(tb, name, ifname, arrived_on, frame, 1, 1)?;
    Ok((verdict, out))
}

/// `runs` test runs of `repeat` repeats each; every run must give the same verdict. The frame
/// the first run left, and each run's mean time.
fn run_repeated(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    arrived_on: Option<&str>,
    frame: Vec<u8>,
    repeat: u32,
    runs: usize,
) -> anyhow::Result<(u32, Vec<u8>, Vec<Duration>)> {
    let pin = tb.loaded_version_dir().join("progs").join(name);
    let ifname = CString::new(ifname).unwrap();
    let arrived_on = arrived_on.map(|name| CString::new(name).unwrap());
    let name = name.to_string();
    in_netns(&tb.node.name, move || {
        let ctx = skb_context(&ifname, arrived_on.as_ref())?;
        let program = SchedClassifier::from_pin(&pin)?;
        let (mut first, mut times) = (None, Vec::with_capacity(runs));
        for _ in 0..runs.max(1) {
            let mut out = vec![0u8; frame.len() + 64];
            let result = program.test_run(TestRunOptions {
                data_in: Some(&frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                repeat,
                ..TestRunOptions::default()
            })?;
            out.truncate(result.data_size_out as usize);
            times.push(result.duration);
            match &first {
                None => first = Some((result.return_value, out)),
                Some((verdict, _)) => {
                    anyhow::ensure!(
                        *verdict == result.return_value,
                        "{name}: verdict {verdict} then {}",
                        result.return_value
                    )
                }
            }
        }
        let (verdict, out) = first.expect("at least one run");
        Ok((verdict, out, times))
    })
}

/// The `struct __sk_buff` a test run starts from: up to and including `ifindex` (offset 40),
/// `ingress_ifindex` at 36 when the frame `arrived_on` another device; the rest stays zero.
/// The devices are looked up in the caller's namespace (the node's).
fn skb_context(ifname: &CString, arrived_on: Option<&CString>) -> anyhow::Result<[u8; 44]> {
    // SAFETY: NUL-terminated names.
    let index = |name: &CString| unsafe { libc::if_nametoindex(name.as_ptr()) };
    let ifindex = index(ifname);
    anyhow::ensure!(ifindex > 0, "no interface {ifname:?}");
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    if let Some(arrived_on) = arrived_on {
        let ingress = index(arrived_on);
        anyhow::ensure!(ingress > 0, "no interface {arrived_on:?}");
        ctx[36..40].copy_from_slice(&ingress.to_ne_bytes());
    }
    Ok(ctx)
}

/// Asserts the verdict of `frame` and, for a drop, that its reason was counted once.
pub fn expect(
    tb: &Testbed,
    name: &str,
    ifname: &str,
    what: &str,
    frame: Vec<u8>,
    verdict: u32,
    reason: Option<DropReason>,
) -> Vec<u8> {
    let before = reason.map(|r| tb.drops(r).unwrap());
    let (got, out) = run(tb, name, ifname, frame);
    assert_eq!(got, verdict, "{name}: {what}: verdict {got:#x}, expected {verdict:#x}");
    if let (Some(reason), Some(before)) = (reason, before) {
        let after = tb.drops(reason).unwrap();
        // The pods' kernels add `UnsupportedProtocol` drops of their own (IPv6 router
        // solicitations) at any moment: for that reason, at least one more is all a test can ask.
        let counted = if reason == DropReason::UnsupportedProtocol { after > before } else { after == before + 1 };
        assert!(counted, "{name}: {what}: {reason:?} not counted ({before} before, {after} after)");
    }
    out
}

/// Runs the pinned program `name` on `frame` as if it arrived on `ifname` from a NIC that
/// reports `CHECKSUM_COMPLETE`: the kernel sets `skb->csum` to the sum of the frame and fails the
/// run with `EBADMSG` if the program leaves it disagreeing with the frame it returns
/// (`BPF_F_TEST_SKB_CHECKSUM_COMPLETE`, Linux 6.12 and later; aya has no setter for it, hence
/// the raw `bpf(2)` call).
pub fn run_checksum_complete(tb: &Testbed, name: &str, ifname: &str, frame: Vec<u8>) -> anyhow::Result<(u32, Vec<u8>)> {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_F_TEST_SKB_CHECKSUM_COMPLETE: u32 = 1 << 2;
    let pin = tb.loaded_version_dir().join("progs").join(name);
    let ifname = CString::new(ifname).unwrap();
    in_netns(&tb.node.name, move || {
        let ctx = skb_context(&ifname, None)?;
        let program = SchedClassifier::from_pin(&pin)?;
        let fd = program.fd()?.as_fd().as_raw_fd();
        let mut out = vec![0u8; frame.len() + 64];
        // `union bpf_attr`'s `test` member, field by field (offsets of the UAPI struct).
        let mut attr = [0u8; 80];
        let mut put = |at: usize, bytes: &[u8]| attr[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &(fd as u32).to_ne_bytes());
        put(8, &(frame.len() as u32).to_ne_bytes());
        put(12, &(out.len() as u32).to_ne_bytes());
        put(16, &(frame.as_ptr() as u64).to_ne_bytes());
        put(24, &(out.as_mut_ptr() as u64).to_ne_bytes());
        put(32, &1u32.to_ne_bytes());
        put(40, &(ctx.len() as u32).to_ne_bytes());
        put(48, &(ctx.as_ptr() as u64).to_ne_bytes());
        put(64, &BPF_F_TEST_SKB_CHECKSUM_COMPLETE.to_ne_bytes());
        // SAFETY: `attr` is a valid `test` attribute whose pointers outlive the call.
        let ret = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, attr.as_mut_ptr(), attr.len()) };
        if ret != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let retval = u32::from_ne_bytes(attr[4..8].try_into().unwrap());
        out.truncate(u32::from_ne_bytes(attr[12..16].try_into().unwrap()) as usize);
        Ok((retval, out))
    })
}

/// Runs the pinned program `name` once on each of `frames` (as arriving on `ifname`), all in
/// one go (the program opened once): the verdicts, in order. For floods of distinct flows.
pub fn run_each(tb: &Testbed, name: &str, ifname: &str, frames: Vec<Vec<u8>>) -> anyhow::Result<Vec<u32>> {
    let pin = tb.loaded_version_dir().join("progs").join(name);
    let ifname = CString::new(ifname).unwrap();
    in_netns(&tb.node.name, move || {
        let ctx = skb_context(&ifname, None)?;
        let program = SchedClassifier::from_pin(&pin)?;
        let mut verdicts = Vec::with_capacity(frames.len());
        for frame in &frames {
            let mut out = vec![0u8; frame.len() + 64];
            let options = TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(&ctx),
                ..Default::default()
            };
            verdicts.push(program.test_run(options)?.return_value);
        }
        Ok(verdicts)
    })
}
