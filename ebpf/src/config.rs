//! The network's datapath settings, a global the plugin sets when it loads the programs.
use ebpf_common::DatapathConfig;

/// Set by the loader (`EbpfLoader::set_global`); all zero means "no masquerade, no cluster".
#[unsafe(no_mangle)]
static CONFIG: DatapathConfig = DatapathConfig {
    cluster_ipv4: [0; 4],
    cluster_prefix: 0,
    masquerade: 0,
    pad: [0; 2],
    node_ipv4: [0; 4],
    uplink_ifindex: 0,
    port_min: 0,
    port_max: 0,
    node_pods_ipv4: [0; 4],
    node_pods_prefix: 0,
    pad2: [0; 3],
    pod_flows_per_minute: 0,
    cluster_ipv6: [0; 16],
    cluster_prefix6: 0,
    node_pods_prefix6: 0,
    pad3: [0; 2],
    node_pods_ipv6: [0; 16],
    node_ipv6: [0; 16],
};

/// The settings, read in place rather than copied (a copy is 112 bytes of a 512-byte stack).
/// The global's address is read volatile, so the compiler cannot see which static the fields
/// come from, and cannot fold them to the zero initialiser.
#[inline(always)]
pub fn get() -> &'static DatapathConfig {
    let address: *const DatapathConfig = &CONFIG;
    // SAFETY: reading a local; the pointer is to a plain global that nothing writes after load.
    unsafe { &*core::ptr::read_volatile(&address) }
}
