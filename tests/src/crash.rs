//! Crash points: the steps a debug build of the plugin can be killed at with SIGKILL
//! (`EBPF_CNI_DIE_AT`), and a helper that runs a verb and checks it died there.
use crate::Testbed;

/// ADD's steps, in the order it runs them (`ipam:mid-reserve` is between writing a
/// reservation aside and linking it into place; `add:mid-load` is only reached by the first ADD
/// of a network, between pinning the maps and the programs).
pub const ADD_STEPS: [&str; 8] = [
    "ipam:mid-reserve",
    "add:after-ipam",
    "add:after-veth",
    "add:after-routes",
    "add:mid-load",
    "add:after-load",
    "add:after-endpoints",
    "add:after-attach",
];

/// DEL's steps, in order.
pub const DEL_STEPS: [&str; 2] = ["del:after-veth", "del:after-datapath"];

/// A step only the network's last DEL (or a GC that empties it) reaches, between the two
/// above: its pins' mark of a complete load (`from_pod`) is gone, its uplink filters and the
/// rest of its pins not yet.
pub const LAST_DEL_STEP: &str = "del:mid-unload";

/// Runs `command` for `pod` (spec 1.1.0) with the plugin told to die at `step`; asserts it
/// did, so that a renamed step cannot turn a crash test into a plain one.
pub fn killed_at(tb: &Testbed, pod: usize, command: &str, step: &str) {
    let netns = tb.sandbox(pod).netns;
    let out = tb.cni_env(command, pod, &tb.conf("1.1.0"), &netns, &[("EBPF_CNI_DIE_AT", step)]).unwrap();
    assert_eq!(out.killed_by, Some(9), "{command} was not killed at {step}: {} {}", out.stdout, out.stderr);
}
