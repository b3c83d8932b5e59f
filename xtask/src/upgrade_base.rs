//! The previous release's plugin, for the upgrade test: its sources taken from git history
//! (`git archive`, nothing checked out over the tree) and built in a directory of its own under
//! `target/`, once; later runs reuse the binary.
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{cargo_output, cmd};

/// The release before this one's layout (v3), the one nodes upgrade from.
pub const COMMIT: &str = "52899e9";

/// Builds (or finds) the previous release's debug binary and returns its path.
pub fn build() -> Result<PathBuf> {
    let dir = cmd::workspace().join("target").join("upgrade-base").join(COMMIT);
    let binary = dir.join("target/debug/ebpf-cni");
    if binary.is_file() {
        return Ok(binary);
    }
    eprintln!("building the previous release ({COMMIT}) for the upgrade test…");
    let sources = dir.join("src");
    let _ = std::fs::remove_dir_all(&sources);
    std::fs::create_dir_all(&sources).with_context(|| format!("creating {}", sources.display()))?;
    let archive = dir.join("src.tar");
    cmd::status(cmd::command("git").args(["archive", "--format=tar", "-o"]).arg(&archive).arg(COMMIT))
        .with_context(|| format!("the clone needs its history up to {COMMIT}"))?;
    cmd::status(cmd::command("tar").arg("-xf").arg(&archive).arg("-C").arg(&sources))?;
    let mut build = cmd::command("cargo");
    build.current_dir(&sources).args(["build", "--package", "cni-plugin", "--target-dir"]).arg(dir.join("target"));
    cargo_output::run(&mut build)?;
    anyhow::ensure!(binary.is_file(), "the build of {COMMIT} left no {}", binary.display());
    Ok(binary)
}
