//! Where a run's figures came from, for the top of its results file: the commit of this tree
//! (so a figure can be traced to the code it measured) and the machine (absolute figures only
//! compare between runs on the same kind of machine).
use std::{path::Path, process::Command};

use ebpf_cni_tests::run;

/// `Commit: 1a52f97-dirty. Machine: AMD EPYC, 2 CPUs, kernel 6.18.44.`
pub fn line() -> String {
    let tree = Path::new(env!("CARGO_MANIFEST_DIR"));
    let commit = commit(tree).unwrap_or_else(|| "unknown (no git checkout)".into());
    format!("Commit: {commit}. Machine: {}.", machine())
}

/// `git rev-parse --short HEAD`, with `-dirty` when a tracked file differs from it.
fn commit(tree: &Path) -> Option<String> {
    let head = git(tree, &["rev-parse", "--short", "HEAD"])?;
    let changes = git(tree, &["status", "--porcelain", "--untracked-files=no"])?;
    Some(if changes.is_empty() { head } else { format!("{head}-dirty") })
}

fn git(tree: &Path, args: &[&str]) -> Option<String> {
    // The bench runs as root in a checkout that may be another user's: git refuses to read such
    // a repository unless told it is safe.
    let out = Command::new("git").arg("-C").arg(tree).args(["-c", "safe.directory=*"]).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The CPU model, how many CPUs the run may use, and the kernel release.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu_model(&cpuinfo).unwrap_or("unknown CPU");
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = run("uname", &["-r"])
        .map_or_else(|_| "unknown".into(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    format!("{model}, {cpus} CPUs, kernel {kernel}")
}

/// The first `model name` of /proc/cpuinfo (x86; other architectures name it otherwise).
fn cpu_model(cpuinfo: &str) -> Option<&str> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        matches!(key.trim(), "model name" | "Model" | "cpu model").then(|| value.trim()).filter(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_model_is_the_first_model_name() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(cpuinfo), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model("processor\t: 0\n"), None);
    }

    #[test]
    fn the_line_names_this_trees_commit_and_the_machine() {
        let line = line();
        assert!(
            line.starts_with("Commit: ") && line.contains(". Machine: ") && line.contains(" CPUs, kernel "),
            "{line}"
        );
    }
}
