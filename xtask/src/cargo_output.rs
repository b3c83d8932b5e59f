//! cargo's stderr without the lines aya-build replays. cni-plugin's build script builds the eBPF
//! programs with a nested cargo and re-emits every line of it as a build-script warning
//! (`warning: cni-plugin@0.1.0: Compiling …`), 50–60 of them per build, which drown what a
//! developer or CI log is there to show. They are held back and printed in full only when the
//! build script itself failed: a broken eBPF build still shows everything, a failing test does
//! not bury its report under a build that went fine.
use std::{
    io::{BufRead as _, BufReader, IsTerminal as _, Write as _},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::cmd::describe;

/// Runs `cmd` (a cargo command) with stdout inherited, so test output flows as usual, and
/// stderr forwarded line by line as it comes, minus the replayed lines.
pub fn run(cmd: &mut Command) -> Result<()> {
    // Through a pipe cargo would drop its colours; keep them for a person at a terminal.
    if std::io::stderr().is_terminal() && std::env::var_os("CARGO_TERM_COLOR").is_none() {
        cmd.env("CARGO_TERM_COLOR", "always");
    }
    let mut child = cmd.stderr(Stdio::piped()).spawn().with_context(|| format!("cannot run `{}`", describe(cmd)))?;
    let mut pipe = BufReader::new(child.stderr.take().context("cargo's stderr")?);
    let mut held = Vec::new();
    let mut line = Vec::new();
    let mut build_script_failed = false;
    while pipe.read_until(b'\n', &mut line).context("reading cargo's stderr")? > 0 {
        if is_replayed(&line) {
            held.extend_from_slice(&line);
        } else {
            build_script_failed |= is_build_script_failure(&line);
            let _ = std::io::stderr().write_all(&line);
        }
        line.clear();
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        if build_script_failed && !held.is_empty() {
            eprintln!("-- the eBPF build's output (hidden while it succeeds):");
            let _ = std::io::stderr().write_all(&held);
        }
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// A line aya-build replayed, or cargo's count of them.
fn is_replayed(line: &[u8]) -> bool {
    let text = without_escapes(&String::from_utf8_lossy(line));
    text.starts_with("warning: cni-plugin@") || text.starts_with("warning: `cni-plugin` (build script) generated")
}

/// cargo's line saying cni-plugin's build script (the eBPF build) failed.
fn is_build_script_failure(line: &[u8]) -> bool {
    without_escapes(&String::from_utf8_lossy(line)).contains("failed to run custom build command for `cni-plugin")
}

/// The text without ANSI colour sequences (`ESC [ … letter`).
fn without_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().take_while(|c| !c.is_ascii_alphabetic()).for_each(drop);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{is_build_script_failure, is_replayed};

    #[test]
    fn replayed_lines_are_recognised_coloured_or_not() {
        assert!(is_replayed(b"warning: cni-plugin@0.1.0: Compiling ebpf v0.1.0\n"));
        assert!(is_replayed(b"\x1b[1m\x1b[33mwarning\x1b[0m\x1b[1m:\x1b[0m cni-plugin@0.1.0: Finished\n"));
        assert!(is_replayed(b"warning: `cni-plugin` (build script) generated 57 warnings\n"));
        assert!(!is_replayed(b"   Compiling cni-plugin v0.1.0\n"));
        assert!(!is_replayed(b"warning: unused variable: `x`\n"));
        assert!(!is_replayed(b"error: failed to run custom build command for `cni-plugin v0.1.0`\n"));
        assert!(is_build_script_failure(b"error: failed to run custom build command for `cni-plugin v0.1.0 (/w)`\n"));
        assert!(!is_build_script_failure(b"error: 1 target failed:\n"));
    }
}
