//! Earlier releases' plugins, for the upgrade tests: their sources taken from git history
//! (`git archive`, nothing checked out over the tree) and built in a directory of their own under
//! `target/upgrade-base/<commit>/`, once; later runs reuse the binary.
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{cargo_output, cmd};

/// The previous release, cbce232: the same pinned layout as this build (v4), so a node upgrading
/// from it finds its own layout's pins already loaded (`EBPF_CNI_PREVIOUS_RELEASE_BIN`,
/// `tests/tests/upgrade_same_layout.rs`).
pub const PREVIOUS_RELEASE: &str = "cbce232";

/// The previous layout's last release, 52899e9 (v3): this build attaches to its pins until the
/// network's last pod is gone (`EBPF_CNI_BASE_BIN`, `tests/tests/upgrade.rs`).
pub const PREVIOUS_LAYOUT_RELEASE: &str = "52899e9";

/// Builds (or finds) `commit`'s debug binary and returns its absolute path.
pub fn build(commit: &str) -> Result<PathBuf> {
    let dir = cmd::workspace().join("target").join("upgrade-base").join(commit);
    let binary = dir.join("target/debug/ebpf-cni");
    if binary.is_file() {
        return Ok(binary);
    }
    eprintln!("building release {commit} for the upgrade tests…");
    let sources = dir.join("src");
    let _ = std::fs::remove_dir_all(&sources);
    std::fs::create_dir_all(&sources).with_context(|| format!("creating {}", sources.display()))?;
    let archive = dir.join("src.tar");
    cmd::status(cmd::command("git").args(["archive", "--format=tar", "-o"]).arg(&archive).arg(commit))
        .with_context(|| format!("the clone needs its history up to {commit}"))?;
    cmd::status(cmd::command("tar").arg("-xf").arg(&archive).arg("-C").arg(&sources))?;
    let mut build = cmd::command("cargo");
    build.current_dir(&sources).args(["build", "--package", "cni-plugin", "--target-dir"]).arg(dir.join("target"));
    cargo_output::run(&mut build)?;
    anyhow::ensure!(binary.is_file(), "the build of {commit} left no {}", binary.display());
    Ok(binary)
}

/// Both bases, as the variables the tests read them from.
pub fn build_all() -> Result<[(&'static str, PathBuf); 2]> {
    Ok([
        ("EBPF_CNI_BASE_BIN", build(PREVIOUS_LAYOUT_RELEASE)?),
        ("EBPF_CNI_PREVIOUS_RELEASE_BIN", build(PREVIOUS_RELEASE)?),
    ])
}
