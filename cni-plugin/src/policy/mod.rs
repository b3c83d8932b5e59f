//! Kubernetes NetworkPolicy compiled into the datapath's maps (ebpf-common's `policy.rs` is the
//! contract): pure Rust, no BPF. The agent (`agent/policy.rs`) and `ebpf-cni policy-set` feed
//! an [`Input`] to the [`Compiler`] and write the [`Changes`] from the previous compile.
//!
//! - `input.rs`: the objects, the node's addresses and its pods in `ENDPOINTS`;
//! - `spec.rs`, `selector.rs`, `ports.rs`, `prefix.rs`: a policy read and checked;
//! - `identities.rs`: addresses numbered by what they are; `slots.rs`: each policy's counter;
//! - `compile.rs`: the maps' contents; `diff.rs`: what changed; `names.rs`: the monitor's file.
mod compile;
mod diff;
mod identities;
mod input;
mod names;
mod ports;
mod prefix;
mod selector;
mod slots;
mod spec;
#[cfg(test)]
mod tests;

pub use compile::{Compiled, Compiler, RuleKey};
pub use diff::Changes;
pub use input::{Input, InputFile, Local};
pub use names::{DEFAULT_PATH as DEFAULT_NAMES_PATH, Names};
pub use prefix::Prefix;
