//! Loading, pinning and attaching the TC programs, and the maps they share with us.
mod audit;
mod bpffs;
mod datapath;
mod host_veths;
mod kernel_btf;
mod loader;
mod maps_ahead;
mod nat;
mod pins;
pub mod policy_endpoints;
pub mod policy_maps;
pub mod read;
pub mod services;
mod settings;
mod socket_lb;
mod stack_epochs;
mod uplink;

pub use audit::Expected;
pub use bpffs::ensure_mounted as mount_bpffs_if_missing;
pub use datapath::{Datapath, add_clsact};
pub use nat::{recount_shares, sweep_flows};
pub use pins::Pins;
pub use settings::Settings;
pub use stack_epochs::renew_stack_epochs;
