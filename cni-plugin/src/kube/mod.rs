//! Where the installer and the node agent learn about nodes: the API server (in a pod, with the
//! service account's token and CA; or any URL given) or a file holding an API response, which
//! is how they are tested without a cluster.
mod node;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
pub use node::{Node, NodeList};
use ureq::{
    Agent,
    tls::{Certificate, RootCerts, TlsConfig},
};

/// Where a pod's service account credentials are mounted.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Node lists of 5,000 nodes run to tens of MiB.
const BODY_LIMIT: u64 = 256 << 20;

/// A request that takes longer is a broken API server: try again next round.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Clone, Debug)]
pub struct Source {
    /// Read nodes from this file (the JSON of `GET /api/v1/nodes` or of one node) instead of
    /// the API server.
    #[arg(long, conflicts_with = "api_server")]
    nodes_file: Option<PathBuf>,
    /// The API server's URL. Default: in-cluster (KUBERNETES_SERVICE_HOST and _PORT, with the
    /// service account's token and CA).
    #[arg(long)]
    api_server: Option<String>,
}

impl Source {
    /// Every node of the cluster.
    pub fn nodes(&self) -> Result<Vec<Node>> {
        let text = match &self.nodes_file {
            Some(path) => read(path)?,
            None => Api::in_cluster(self.api_server.as_deref())?.get("/api/v1/nodes")?,
        };
        // A file may hold a list or a single node.
        match serde_json::from_str::<NodeList>(&text) {
            Ok(list) => Ok(list.items),
            Err(_) => Ok(vec![serde_json::from_str::<Node>(&text).context("neither a NodeList nor a Node")?]),
        }
    }

    /// One node. From the API server only that node is fetched: every node's installer runs at
    /// once on a DaemonSet rollout, and listing all nodes each time would cost N² on a big cluster.
    pub fn node(&self, name: &str) -> Result<Node> {
        if self.nodes_file.is_none() {
            let text = Api::in_cluster(self.api_server.as_deref())?.get(&format!("/api/v1/nodes/{name}"))?;
            return serde_json::from_str(&text).with_context(|| format!("node {name:?}: not a Node"));
        }
        let nodes = self.nodes()?;
        nodes.into_iter().find(|n| n.metadata.name == name).with_context(|| format!("no node named {name:?}"))
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

struct Api {
    base: String,
    token: Option<String>,
    agent: Agent,
}

impl Api {
    fn in_cluster(server: Option<&str>) -> Result<Self> {
        let base = match server {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let var = |k: &str| {
                    std::env::var(k).with_context(|| format!("{k} is not set: not in a pod? use --api-server"))
                };
                let (host, port) = (var("KUBERNETES_SERVICE_HOST")?, var("KUBERNETES_SERVICE_PORT")?);
                // An IPv6 service address needs brackets in a URL.
                if host.contains(':') { format!("https://[{host}]:{port}") } else { format!("https://{host}:{port}") }
            }
        };
        let account = Path::new(SERVICE_ACCOUNT);
        let token = read(&account.join("token")).ok().map(|t| t.trim().to_string());
        let mut config = Agent::config_builder().timeout_global(Some(TIMEOUT));
        if let Ok(ca) = std::fs::read(account.join("ca.crt")) {
            let ca = Certificate::from_pem(&ca).context("the service account's ca.crt is not a PEM certificate")?;
            let roots = RootCerts::Specific(Arc::new(vec![ca]));
            config = config.tls_config(TlsConfig::builder().root_certs(roots).build());
        }
        Ok(Self { base, token, agent: Agent::new_with_config(config.build()) })
    }

    fn get(&self, path: &str) -> Result<String> {
        let url = format!("{}{path}", self.base);
        let mut request = self.agent.get(&url).header("Accept", "application/json");
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let mut response = request.call().with_context(|| format!("GET {url}"))?;
        if !response.status().is_success() {
            bail!("GET {url}: {}", response.status());
        }
        // The default cap (10 MiB) is below the node list of a large cluster.
        response
            .body_mut()
            .with_config()
            .limit(BODY_LIMIT)
            .read_to_string()
            .with_context(|| format!("reading the answer of {url}"))
    }
}
