//! Running child commands with the toolchain on PATH (CI does not use a login shell).
use std::{
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::cargo_output;

/// The workspace root (xtask lives one level below it).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}

/// PATH with `$HOME/.cargo/bin` first: aya-build needs `rustup` and `bpf-linker` there.
pub fn path_env() -> OsString {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let mut dirs = vec![PathBuf::from(home).join(".cargo/bin")];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).expect("PATH entries have no separator")
}

pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("PATH", path_env()).current_dir(workspace());
    cmd
}

/// The command line as a person would type it, for error messages (Command's Debug form also
/// lists every variable set, PATH included).
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(OsStr::to_string_lossy).collect::<Vec<_>>().join(" ")
}

/// Runs to completion with inherited output; fails on a non-zero exit.
pub fn status(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs and returns stdout; fails on a non-zero exit.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run `{}`", describe(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", describe(cmd), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// Runs cargo without the eBPF build's replayed lines on stderr (see [`cargo_output`]).
pub fn cargo_with_env(args: &[&str], env: &[(&str, &OsStr)]) -> Result<()> {
    let mut cmd = command("cargo");
    cmd.args(args).envs(env.iter().copied());
    cargo_output::run(&mut cmd)
}

/// Builds `ebpf-cni` and returns the binary's path.
pub fn build_plugin(release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    eprintln!("building ebpf-cni ({profile}) and its eBPF programs…");
    let mut args = vec!["build", "--package", "cni-plugin"];
    if release {
        args.push("--release");
    }
    cargo(&args)?;
    Ok(workspace().join("target").join(profile).join("ebpf-cni"))
}
