//! Installs what building and testing need, idempotently: system packages from apt, the nightly
//! toolchain's rust-src, bpf-linker built against the same LLVM major as nightly's rustc
//! (bpf-linker reads rustc's bitcode, so the two LLVMs must agree), and the Prometheus
//! text-format parser the metrics tests read pages with (Python's `prometheus_client`, pip).
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd::{command, output, status};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Tools the tests, the demo and the benchmarks call: ip, ping, nsenter/mount, sysctl, bpftool,
/// iperf3, sockperf and qperf (latency over IPv6), the reference plugins (`bridge` to compare with, `static` as a delegated IPAM
/// plugin), and iptables/nft (bridge's ipMasq needs iptables; tests show our node has no rules).
const PACKAGES: [&str; 11] = [
    "iproute2",
    "iputils-ping",
    "util-linux",
    "procps",
    "bpftool",
    "iperf3",
    "sockperf",
    "qperf",
    "containernetworking-plugins",
    "iptables",
    "nftables",
];

pub fn run() -> Result<()> {
    let llvm = nightly_llvm_major()?;
    let llvm_dev = format!("llvm-{llvm}-dev");
    let mut wanted: Vec<&str> = PACKAGES.to_vec();
    wanted.push(&llvm_dev);
    apt_install(&wanted)?;
    rust_src()?;
    bpf_linker(llvm)?;
    // The same check-then-install the tests make, done once here for a fresh machine.
    ebpf_cni_tests::prometheus::ensure_parser()
        .with_context(|| format!("installing {}", ebpf_cni_tests::prometheus::PROMETHEUS_CLIENT))?;
    Ok(())
}

/// The LLVM major version of the `nightly` toolchain's rustc (installing nightly if missing).
fn nightly_llvm_major() -> Result<u32> {
    let toolchains = output(command("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        status(command("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))?;
    }
    let version = output(command("rustup").args(["run", "nightly", "rustc", "-vV"]))?;
    version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .context("cannot read nightly rustc's LLVM version")
}

pub fn apt_install(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
            !out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing {}", missing.join(" "));
    status(command("apt-get").arg("update").arg("-q"))?;
    status(
        command("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("apt-get could not install {}", missing.join(" ")))
}

fn rust_src() -> Result<()> {
    let installed = output(command("rustup").args(["component", "list", "--installed", "--toolchain", "nightly"]))?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    status(command("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// bpf-linker's LLVM major, read from the libLLVM it links (its --version does not say).
fn bpf_linker_llvm() -> Option<u32> {
    let version = output(command("bpf-linker").arg("--version")).ok()?;
    if version.trim() != format!("bpf-linker {BPF_LINKER_VERSION}") {
        return None;
    }
    let path = output(command("sh").args(["-c", "command -v bpf-linker"])).ok()?;
    let libs = output(command("ldd").arg(path.trim())).ok()?;
    libs.lines().find_map(|l| l.trim().strip_prefix("libLLVM.so.")?.split(['.', ' ']).next()?.parse().ok())
}

fn bpf_linker(llvm: u32) -> Result<()> {
    if bpf_linker_llvm() == Some(llvm) {
        return Ok(());
    }
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM {llvm} (a minute or two)");
    status(
        command("cargo")
            .args(["install", "--locked", "--force", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
            .args(["--no-default-features", "--features", &format!("llvm-{llvm}")])
            .env("LLVM_PREFIX", format!("/usr/lib/llvm-{llvm}")),
    )?;
    match bpf_linker_llvm() {
        Some(found) if found == llvm => Ok(()),
        found => bail!(
            "bpf-linker links LLVM {found:?} but nightly rustc uses LLVM {llvm}: they must be equal. \
             Install llvm-{llvm}-dev and rerun `cargo xtask setup`."
        ),
    }
}
