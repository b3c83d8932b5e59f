//! Where the installer and the node agent learn about nodes: the API server (in a pod, with the
//! service account's token and CA; or any URL given) or a file holding an API response, which
//! is how they are tested without a cluster.
mod api;
mod cache;
mod node;
mod watch;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
pub use api::Api;
pub use cache::{Change, NodeCache};
use clap::Args;
pub use node::{Node, NodeList};

#[derive(Args, Clone, Debug)]
pub struct Source {
    /// Read nodes from this file (the JSON of `GET /api/v1/nodes` or of one node) instead of
    /// the API server. The agent reads it again every --interval.
    #[arg(long, conflicts_with = "api_server")]
    nodes_file: Option<PathBuf>,
    /// The API server's URL. Default: in-cluster (KUBERNETES_SERVICE_HOST and _PORT, with the
    /// service account's token and CA).
    #[arg(long)]
    api_server: Option<String>,
}

impl Source {
    /// The API server to watch; `None` when nodes come from a file.
    pub fn api(&self) -> Result<Option<Api>> {
        match self.nodes_file {
            Some(_) => Ok(None),
            None => Api::in_cluster(self.api_server.as_deref()).map(Some),
        }
    }

    /// Every node of the cluster, with the list's resource version when from the API server.
    pub fn list(&self) -> Result<NodeList> {
        let Some(path) = &self.nodes_file else {
            return Api::in_cluster(self.api_server.as_deref())?.list_nodes();
        };
        let text = read(path)?;
        // A file may hold a list or a single node.
        match serde_json::from_str::<NodeList>(&text) {
            Ok(list) => Ok(list),
            Err(_) => {
                let node = serde_json::from_str::<Node>(&text).context("neither a NodeList nor a Node")?;
                Ok(NodeList { metadata: Default::default(), items: vec![node] })
            }
        }
    }

    /// One node. From the API server only that node is fetched: every node's installer runs at
    /// once on a DaemonSet rollout, and listing all nodes each time would cost N² on a big cluster.
    pub fn node(&self, name: &str) -> Result<Node> {
        if self.nodes_file.is_none() {
            let text = Api::in_cluster(self.api_server.as_deref())?.get(&format!("/api/v1/nodes/{name}"))?;
            return serde_json::from_str(&text).with_context(|| format!("node {name:?}: not a Node"));
        }
        let nodes = self.list()?.items;
        nodes.into_iter().find(|n| n.metadata.name == name).with_context(|| format!("no node named {name:?}"))
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}
