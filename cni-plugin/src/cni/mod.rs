//! The CNI protocol: environment, network configuration, results, errors and versions.
pub mod bandwidth;
pub mod config;
pub mod env;
pub mod error;
#[cfg(test)]
mod fuzz;
pub mod node_conf;
pub mod request;
pub mod result;
pub mod version;

pub use error::{CniError, CniResult, Context, ErrorCode};
