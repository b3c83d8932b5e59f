//! kube's client for the API server the command line names: a URL (plain `http://` works, as
//! the tests use), a kubeconfig file, or by default the pod's in-cluster configuration (the
//! service account's token, renewed in place by the kubelet and read again by kube, and its CA).
use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::rounds::Rounds;

pub enum Target<'a> {
    Url(&'a str),
    Kubeconfig(&'a Path),
    InCluster,
}

/// Must run inside a tokio runtime: the client's request queue is a task of its own.
/// `read_timeout`: how long one read may wait (a watch's own end comes from its `timeoutSeconds`).
pub async fn client(target: Target<'_>, read_timeout: Duration, rounds: &Rounds) -> Result<Client> {
    let mut config = match target {
        Target::Url(url) => Config::new(url.parse().with_context(|| format!("--api-server {url:?} is not a URL"))?),
        Target::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("{}: no usable context", path.display()))?
        }
        Target::InCluster => {
            Config::incluster().context("no in-cluster configuration: not in a pod? use --api-server")?
        }
    };
    config.read_timeout = Some(read_timeout);
    let builder = ClientBuilder::try_from(config).context("building the API client")?;
    Ok(builder.with_layer(rounds).build())
}
