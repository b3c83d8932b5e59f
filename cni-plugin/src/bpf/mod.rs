//! Loading, pinning and attaching the TC programs, and the maps they share with us.
mod datapath;
mod pins;

pub use datapath::Datapath;
