//! Who and what the matrix is about: the nine pods, the four served ports, the two families.
use std::fmt;

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const POD_NAMES: [&str; 3] = ["a", "b", "c"];

/// A pod by namespace and name (`x/a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub ns: &'static str,
    pub name: &'static str,
}

impl PodRef {
    pub const fn new(ns: &'static str, name: &'static str) -> Self {
        Self { ns, name }
    }

    /// The nine pods, in the matrix's order (x/a, x/b, x/c, y/a…).
    pub fn all() -> Vec<Self> {
        NAMESPACES.iter().flat_map(|ns| POD_NAMES.iter().map(|name| Self::new(ns, name))).collect()
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ns, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// As the API spells it.
    pub fn api_name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }
}

/// One served port of every pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    pub protocol: Protocol,
    pub port: u16,
}

pub const TCP_80: Target = Target { protocol: Protocol::Tcp, port: 80 };
pub const TCP_81: Target = Target { protocol: Protocol::Tcp, port: 81 };
pub const UDP_80: Target = Target { protocol: Protocol::Udp, port: 80 };
pub const UDP_81: Target = Target { protocol: Protocol::Udp, port: 81 };
pub const ALL_TARGETS: [Target; 4] = [TCP_80, TCP_81, UDP_80, UDP_81];

impl Target {
    /// The container port's name, as upstream's test pods name theirs (`serve-80-tcp`).
    pub fn port_name(self) -> String {
        format!("serve-{}-{}", self.port, self.protocol.api_name().to_lowercase())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.protocol.api_name(), self.port)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}
