//! Counts of what the model met and could not serve as given. Each comes with a log line where it
//! happens; the counts are for metrics and the debug dump.
use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Services left to others on purpose: headless, ExternalName, another proxy's
    /// (`service.kubernetes.io/service-proxy-name`). Not errors.
    pub services_skipped: u64,
    /// Services that could not be read at all (no ports, no usable ClusterIP).
    pub bad_services: u64,
    /// Ports left out: SCTP, an unknown protocol, a port number out of range.
    pub ports_skipped: u64,
    /// Addresses (ClusterIPs, external IPs, endpoint addresses) that are not IP addresses.
    pub bad_addresses: u64,
    /// A frontend another Service had first (duplicate ClusterIPs, external IPs, node ports).
    pub duplicate_frontends: u64,
    /// EndpointSlices naming a Service the API server has not listed (or none at all).
    pub orphan_slices: u64,
    /// EndpointSlices with more endpoints than the API allows in one (1000): ignored whole.
    pub oversized_slices: u64,
    /// Frontends whose backends were cut to the model's limit.
    pub truncated_frontends: u64,
    /// Frontend and endpoint addresses no Service may take (loopback, link-local, …).
    pub unroutable_addresses: u64,
}

impl Stats {
    /// Every count with the name the metrics give it.
    pub fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("skipped-services", self.services_skipped),
            ("bad-services", self.bad_services),
            ("skipped-ports", self.ports_skipped),
            ("bad-addresses", self.bad_addresses),
            ("duplicate-frontends", self.duplicate_frontends),
            ("orphan-slices", self.orphan_slices),
            ("oversized-slices", self.oversized_slices),
            ("truncated-frontends", self.truncated_frontends),
            ("unroutable-addresses", self.unroutable_addresses),
        ]
    }
}
