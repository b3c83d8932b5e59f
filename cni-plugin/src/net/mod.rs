//! Interfaces, addresses and routes (rtnetlink), and namespace switching.
pub mod ifb;
pub mod local_link;
pub mod netlink;
pub mod netns;
pub mod qdisc;
pub mod routes;
pub mod sock_diag;
pub mod sysctl;
mod unlink;
