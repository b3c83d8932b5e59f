//! Loading, pinning and attaching the TC programs, and the maps they share with us.
mod audit;
mod datapath;
mod loader;
mod nat;
mod pins;
mod settings;

pub use audit::Expected;
pub use datapath::{Datapath, on_bpffs_or_below};
pub use pins::Pins;
pub use settings::Settings;
