//! Crash injection for tests: a debug build killed with SIGKILL at a named step shows what a
//! crashed ADD or DEL leaves behind, so that tests can prove DEL and GC clean it up. Release
//! builds compile this to nothing.

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
