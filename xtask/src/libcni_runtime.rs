//! The libcni runtime the tests drive ebpf-cni through (`tests/libcni-runtime`): a few lines of
//! Go over Debian's libcni 1.1.2 sources, built offline in GOPATH mode with Debian's Go. Only
//! `cargo xtask test` needs it, so the demo does not install Go.
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::{cmd, setup};

/// Go, and libcni's sources under /usr/share/gocode (the package that provides
/// golang-github-containernetworking-cni-dev).
const PACKAGES: [&str; 2] = ["golang-go", "golang-github-appc-cni-dev"];

/// Builds the driver (Go's build cache makes a rebuild of unchanged sources take a moment) and
/// returns its path.
pub fn build() -> Result<PathBuf> {
    setup::apt_install(&PACKAGES)?;
    let out = cmd::workspace().join("target").join("libcni-runtime");
    let binary = out.join("libcni-runtime");
    cmd::status(
        cmd::command("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg("./tests/libcni-runtime")
            .env("GO111MODULE", "off")
            .env("GOPATH", "/usr/share/gocode")
            .env("GOCACHE", out.join("cache"))
            .env("GOFLAGS", ""),
    )
    .context("building tests/libcni-runtime against Debian's libcni")?;
    Ok(binary)
}
