//! The agent against an API server: one list, then a watch of the changes, resumed where it
//! ended. Each node's agent costs the API server one request per --interval instead of a list of
//! every node (N² load across the cluster).
use std::{collections::BTreeSet, thread::sleep, time::Duration};

use anyhow::Result;
use ipnetwork::IpNetwork;

use super::{plan::pod_cidrs, sync::Syncer};
use crate::kube::{Api, Change, NodeCache};

pub fn run(api: &Api, syncer: &Syncer, round: Duration) -> ! {
    let mut backoff = Backoff::default();
    let mut cache: Option<NodeCache> = None;
    // Pod CIDRs of nodes whose DELETED event came: their routes go even when the rest of the
    // picture is in doubt.
    let mut deleted = BTreeSet::new();
    loop {
        let Some(nodes) = &mut cache else {
            match api.list_nodes().and_then(NodeCache::new) {
                Ok(listed) => {
                    backoff.reset();
                    syncer.sync_logged(&listed.nodes(), &mut deleted, None);
                    cache = Some(listed);
                }
                Err(e) => {
                    let wait = backoff.next();
                    log::error!("listing nodes failed: {e:#}; no route removed; again in {wait:?}");
                    sleep(wait);
                }
            }
            continue;
        };
        match watch(api, nodes, syncer, &mut deleted, round, &mut backoff) {
            // The server's own timeout: the routes are checked (one deleted by hand comes back)
            // and the watch goes on from where it was.
            Ok(None) => syncer.sync_logged(&nodes.nodes(), &mut deleted, None),
            Ok(Some(why)) => {
                log::info!("the watch cannot resume ({why}): listing the nodes again");
                cache = None;
            }
            Err(e) => {
                let wait = backoff.next();
                let version = nodes.resource_version();
                log::warn!("watching nodes: {e:#}; resuming from resource version {version} in {wait:?}");
                syncer.sync_logged(&nodes.nodes(), &mut deleted, Some("the watch failed"));
                sleep(wait);
            }
        }
    }
}

/// One watch request, its events applied as they come. `Some(why)` when only a new list can go
/// on; `None` when the server ended the watch.
fn watch(
    api: &Api,
    cache: &mut NodeCache,
    syncer: &Syncer,
    deleted: &mut BTreeSet<IpNetwork>,
    round: Duration,
    backoff: &mut Backoff,
) -> Result<Option<String>> {
    let Some(mut events) = api.watch_nodes(cache.resource_version(), round)? else {
        return Ok(Some("410 Gone".into()));
    };
    let mut dirty = false;
    while let Some(event) = events.next()? {
        // Events flow: the connection works, and the next failure starts the backoff afresh.
        backoff.reset();
        match cache.apply(event)? {
            Change::None => {}
            Change::Nodes => dirty = true,
            Change::Deleted(node) => {
                deleted.extend(pod_cidrs(&node));
                dirty = true;
            }
            Change::Relist(why) => return Ok(Some(why)),
        }
        if dirty && !events.has_more() {
            syncer.sync_logged(&cache.nodes(), deleted, None);
            dirty = false;
        }
    }
    Ok(None)
}

/// The wait between attempts against a failing API server: 1 s, doubling up to 30 s.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);

    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (wait * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self(Self::FIRST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_up_to_half_a_minute() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..7).map(|_| backoff.next().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_secs(1));
    }
}
