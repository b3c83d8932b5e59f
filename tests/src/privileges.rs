/// Whether this process may build topologies (root). Off CI a test without it is skipped with a
/// note; under `CI=true` it fails, because a privileged test that does not run proves nothing.
pub fn require_privileges(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: needs root to create network namespaces and load eBPF, and CI=true forbids skipping");
    }
    eprintln!("SKIPPED {test}: needs root (network namespaces, eBPF)");
    false
}

/// Whether the effective user is root. The demo and benchmarks check this themselves: for them
/// a missing privilege is an error to report, never a test to skip or a panic.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}
