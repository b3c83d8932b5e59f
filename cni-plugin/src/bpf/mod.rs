//! Loading, pinning and attaching the TC programs, and the maps they share with us.
mod datapath;
mod loader;
mod nat;
mod pins;
mod settings;

pub use datapath::Datapath;
pub use settings::Settings;
