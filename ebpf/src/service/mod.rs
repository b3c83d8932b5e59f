//! Services at connect time (the socket LB): cgroup `sock_addr` programs rewrite a Service's
//! address to one of its backends when a socket connects or sends (`translate.rs`), and show the
//! Service again where the application reads its peer (`reverse.rs`). The flow is then plain
//! pod → pod, on the TC fast paths, with no per-packet translation. Maps in `maps.rs`, the
//! backend choice in `pick.rs`, the context's address fields in `addr.rs`.
pub mod addr;
pub mod maps;
pub mod pick;
pub mod reverse;
pub mod translate;
