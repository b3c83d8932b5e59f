//! STATUS (spec 1.1): whether an ADD could succeed now. Code 50 and the reason when it could
//! not: bpffs missing and not mountable, a kernel without BTF or too old for the programs, the
//! IP pool exhausted, the data dir not writable. A delegated IPAM plugin answers for its own part.
use std::path::Path;

use crate::{
    bpf,
    cni::{CniError, CniResult, ErrorCode, config::NetConf, env::CniEnv},
    ipam::Ipam,
};

/// The newest kernel feature the programs use: `bpf_loop` (masquerade's port search), Linux 5.17.
const KERNEL_SINCE: (u32, u32) = (5, 17);

pub fn status(env: &CniEnv, conf: &NetConf, raw_conf: &[u8]) -> CniResult<()> {
    // A fresh node gets its bpffs here already, as the first ADD would: the node turns Ready
    // without a hand step, and a bpffs that cannot be mounted is this reason, not a failed ADD.
    let root = conf.bpffs_root();
    if let Err(e) = bpf::Datapath::mount_bpffs(&root) {
        return Err(not_available(e.msg).with_details(e.details));
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(not_available("the kernel has no BTF (/sys/kernel/btf/vmlinux is missing)"));
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if kernel_version(&release).is_none_or(|v| v < KERNEL_SINCE) {
        return Err(not_available(format!(
            "kernel {} is too old for the programs (bpf_loop); {}.{} or later is needed",
            release.trim(),
            KERNEL_SINCE.0,
            KERNEL_SINCE.1
        )));
    }
    Ipam::from_conf(conf, raw_conf)?.status(env)
}

/// `6.18.0-1-amd64` → (6, 18).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn not_available(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::NOT_AVAILABLE, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kernel_versions() {
        assert_eq!(kernel_version("6.18.0-1-amd64\n"), Some((6, 18)));
        assert!(kernel_version("5.15.0").unwrap() < KERNEL_SINCE);
        assert_eq!(kernel_version("garbage"), None);
    }
}
