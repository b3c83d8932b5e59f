//! Test hooks, compiled only into debug builds (release builds compile them to nothing):
//! crash injection (a process killed with SIGKILL at a named step shows what a crashed ADD or
//! DEL leaves behind, so that tests can prove DEL and GC clean it up), and a count of the
//! descriptors still open when a verb is done (churn tests assert it never grows).

/// The variable naming the step to die at, e.g. `add:after-veth`.
#[cfg(debug_assertions)]
const DIE_AT: &str = "EBPF_CNI_DIE_AT";

/// Dies here, at once and without cleanup, when `EBPF_CNI_DIE_AT` names `step`.
pub fn point(step: &str) {
    #[cfg(debug_assertions)]
    if std::env::var(DIE_AT).is_ok_and(|wanted| wanted == step) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    #[cfg(not(debug_assertions))]
    let _ = step;
}

/// Prints `ebpf-cni: open fds at exit: N` on stderr when `EBPF_CNI_REPORT_FDS` is set.
pub fn report_open_fds() {
    #[cfg(debug_assertions)]
    if std::env::var_os("EBPF_CNI_REPORT_FDS").is_some() {
        // The listing's own descriptor is one of the entries.
        let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count().saturating_sub(1)).unwrap_or(0);
        eprintln!("ebpf-cni: open fds at exit: {open}");
    }
}
