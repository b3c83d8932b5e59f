//! A throwaway node for tests, the demo and benchmarks: a "node" network namespace holding the
//! host ends, pod namespaces, a private bpffs mount and data dir, all named uniquely per run and
//! removed on drop (pass or fail). The plugin is executed exactly as a runtime does: CNI_*
//! environment, configuration on stdin, in the node's namespace.
pub mod agent;
pub mod bypass;
pub mod cgroup;
mod cluster;
pub mod crash;
mod fake_api;
pub mod fake_store;
pub mod flows;
pub mod frames;
mod guard;
pub mod iperf;
pub mod kube_proxy;
pub mod lan;
mod plugin;
pub mod policy_maps;
mod privileges;
pub mod probe;
pub mod prog_run;
pub mod prometheus;
pub mod runtime;
pub mod scale;
pub mod service_probe;
mod testbed;
pub mod traffic;
pub mod upgrade;

pub use cluster::{
    Cluster, EXT_SERVER, EXT_SERVER_V6, EXT_UPLINK_IP, EXT_UPLINK_IPV6, NODE1_UPLINK_IP, NODE1_UPLINK_IPV6,
    UNDERLAY_IPS, UNDERLAY_IPV6S,
};
pub use fake_api::{ApiRequest, FakeApi, Say};
pub use fake_store::FakeStore;
pub use guard::{Bpffs, MountNamespace, NetnsGuard, run, run_in};
pub use plugin::{CniOutput, Plugin, exec_binary};
pub use privileges::{is_root, require_privileges};
pub use testbed::{Attached, NODE_IP, Pod, TEST_MTU, Testbed};
