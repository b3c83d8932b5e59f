//! The API server over HTTPS: in a pod with the service account's token and CA, or at any URL
//! given. Plain GETs for the installer's node and the agent's list; a long-lived GET for the
//! agent's watch.
use std::{path::Path, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail};
use ureq::{
    Agent, BodyReader, RequestBuilder,
    tls::{Certificate, RootCerts, TlsConfig},
    typestate::WithoutBody,
};

use super::{NodeList, read, watch::Stream};

/// Where a pod's service account credentials are mounted.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Node lists of 5,000 nodes run to tens of MiB; so may one watch round of a busy cluster.
const BODY_LIMIT: u64 = 256 << 20;

/// A request that takes longer is a broken API server: try again next round.
const TIMEOUT: Duration = Duration::from_secs(10);

/// How much longer than the server's own end of a watch (timeoutSeconds) a silent connection is
/// given before it counts as dead: an idle cluster may send nothing for the whole round.
const WATCH_GRACE: Duration = Duration::from_secs(15);

pub struct Api {
    base: String,
    agent: Agent,
}

impl Api {
    pub fn in_cluster(server: Option<&str>) -> Result<Self> {
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
        let mut config = Agent::config_builder().timeout_global(Some(TIMEOUT));
        if let Ok(ca) = std::fs::read(account.join("ca.crt")) {
            let ca = Certificate::from_pem(&ca).context("the service account's ca.crt is not a PEM certificate")?;
            let roots = RootCerts::Specific(Arc::new(vec![ca]));
            config = config.tls_config(TlsConfig::builder().root_certs(roots).build());
        }
        Ok(Self { base, agent: Agent::new_with_config(config.build()) })
    }

    pub fn get(&self, path: &str) -> Result<String> {
        let url = format!("{}{path}", self.base);
        let mut response = self.request(&url).call().with_context(|| format!("GET {url}"))?;
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

    pub fn list_nodes(&self) -> Result<NodeList> {
        serde_json::from_str(&self.get("/api/v1/nodes")?).context("GET /api/v1/nodes: not a NodeList")
    }

    /// The changes to Nodes after `resource_version`, until the server ends the watch after
    /// `round`. `None`: that version is too old (410 Gone), only a new list can go on.
    pub fn watch_nodes(&self, resource_version: &str, round: Duration) -> Result<Option<Stream<BodyReader<'static>>>> {
        let url = format!(
            "{}/api/v1/nodes?watch=1&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={}",
            self.base,
            escape(resource_version),
            round.as_secs()
        );
        // The agent's 10 s budget would cut every watch: this request has its own. A read that
        // waits past the round's end means a dead connection; the overall bound is a backstop
        // against a server that never ends the stream.
        let request = self
            .request(&url)
            .config()
            .timeout_global(Some(round * 2 + WATCH_GRACE))
            .timeout_connect(Some(TIMEOUT))
            .timeout_recv_response(Some(TIMEOUT))
            .timeout_per_read(Some(round + WATCH_GRACE))
            .build();
        let response = match request.call() {
            Err(ureq::Error::StatusCode(410)) => return Ok(None),
            other => other.with_context(|| format!("GET {url}"))?,
        };
        Ok(Some(Stream::new(response.into_body().into_with_config().limit(BODY_LIMIT).reader())))
    }

    fn request(&self, url: &str) -> RequestBuilder<WithoutBody> {
        let request = self.agent.get(url).header("Accept", "application/json");
        // Read for every request: the kubelet renews a projected token in place, and the agent
        // outlives any one token.
        let token = read(&Path::new(SERVICE_ACCOUNT).join("token")).ok().map(|t| t.trim().to_string());
        match token {
            Some(token) => request.header("Authorization", format!("Bearer {token}")),
            None => request,
        }
    }
}

/// A resource version is opaque to clients: percent-encode anything but the unreserved
/// characters of a URL so that it reaches the server as it was received.
fn escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_resource_versions() {
        assert_eq!(super::escape("12345"), "12345");
        assert_eq!(super::escape("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
