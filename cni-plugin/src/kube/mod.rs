//! Where the installer and the node agent learn about the cluster: the API server, through kube's
//! client and watcher (`feed.rs`), or for nodes a file holding an API response, which is how
//! they are tested without a cluster.
mod cache;
mod client;
mod feed;
mod node;
mod rounds;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
pub use cache::NodeCache;
use clap::Args;
pub use client::Target;
pub use feed::{Feed, Update};
use kube::{Api, api::ListParams};
pub use node::{Node, NodeExt, NodeList};

/// How long a plain request (the installer's node, `--once`'s list) may wait for an answer:
/// longer is a broken API server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Clone, Debug)]
pub struct Source {
    /// Read nodes from this file (the JSON of `GET /api/v1/nodes` or of one node) instead of
    /// the API server. The agent reads it again every --interval.
    #[arg(long, conflicts_with_all = ["api_server", "kubeconfig"])]
    nodes_file: Option<PathBuf>,
    /// The API server's URL (`http://` or `https://`), without credentials. Default: in-cluster
    /// (KUBERNETES_SERVICE_HOST and _PORT, with the service account's token and CA).
    #[arg(long, conflicts_with = "kubeconfig")]
    api_server: Option<String>,
    /// Reach the API server as this kubeconfig file's current context says.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

impl Source {
    /// Whether the API server is reached in-cluster, by `KUBERNETES_SERVICE_HOST`: the
    /// `kubernetes` Service's ClusterIP, which without kube-proxy only the agent itself makes
    /// reachable.
    pub fn in_cluster(&self) -> bool {
        self.nodes_file.is_none() && self.api_server.is_none() && self.kubeconfig.is_none()
    }

    /// The API server to watch; `None` when nodes come from a file.
    pub fn target(&self) -> Option<Target<'_>> {
        if self.nodes_file.is_some() {
            return None;
        }
        Some(match (&self.api_server, &self.kubeconfig) {
            (Some(url), _) => Target::Url(url),
            (None, Some(path)) => Target::Kubeconfig(path),
            (None, None) => Target::InCluster,
        })
    }

    /// Every node of the cluster.
    pub fn list(&self) -> Result<Vec<Node>> {
        let Some(path) = &self.nodes_file else {
            let list = self.request(|api| async move { api.list(&ListParams::default()).await })?;
            return Ok(list.items);
        };
        let text = read(path)?;
        // A file may hold a list or a single node: told apart by `items` (k8s-openapi reads a
        // node as an empty list otherwise).
        let value: serde_json::Value = serde_json::from_str(&text).context("not JSON")?;
        if value.get("items").is_some() {
            Ok(serde_json::from_value::<NodeList>(value).context("not a NodeList")?.items)
        } else {
            Ok(vec![serde_json::from_value::<Node>(value).context("neither a NodeList nor a Node")?])
        }
    }

    /// One node. From the API server only that node is fetched: every node's installer runs at
    /// once on a DaemonSet rollout, and listing all nodes each time would cost N² on a big cluster.
    pub fn node(&self, name: &str) -> Result<Node> {
        if self.nodes_file.is_none() {
            let name = name.to_string();
            return self.request(|api| async move { api.get(&name).await });
        }
        let nodes = self.list()?;
        nodes.into_iter().find(|n| n.node_name() == name).with_context(|| format!("no node named {name:?}"))
    }

    /// One request to the API server's nodes, on a runtime of its own.
    fn request<T, F>(&self, call: impl FnOnce(Api<Node>) -> F) -> Result<T>
    where
        F: Future<Output = kube::Result<T>>,
    {
        let target = self.target().context("nodes come from a file")?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = client::client(target, REQUEST_TIMEOUT, &Default::default()).await?;
            let answer = tokio::time::timeout(REQUEST_TIMEOUT, call(Api::all(client))).await;
            Ok(answer.context("the API server did not answer in time")??)
        })
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}
