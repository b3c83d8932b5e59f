//! The agent against an API server: kube's watcher lists the nodes once, then watches the
//! changes, resuming where a watch ended (`kube/feed.rs`); this loop turns its updates into route
//! syncs. Each node's agent costs the API server one request per --interval instead of a list of
//! every node (N² load across the cluster).
use std::{
    collections::BTreeSet,
    sync::mpsc::{Receiver, TryRecvError},
    time::Duration,
};

use super::{plan::pod_cidrs, sync::Syncer};
use crate::kube::{Node, NodeCache, Update};

/// Follows `updates` for as long as the watch thread lives; `round` is each watch's length;
/// `own` is told each state of this node as it comes (the Service model's NodePort addresses).
pub fn run(updates: &Receiver<Update<Node>>, syncer: &Syncer, round: Duration, mut own: impl FnMut(&Node)) {
    let mut state = State { cache: None, deleted: BTreeSet::new(), failure: None, listed: false, round };
    // A burst of events (many nodes joining at once) is drained, then synced once.
    while let Ok(first) = updates.recv() {
        let (mut todo, mut ended) = (Todo::default(), false);
        let mut next = Some(first);
        while let Some(update) = next.take() {
            state.take(update, &mut todo);
            match updates.try_recv() {
                Ok(update) => next = Some(update),
                Err(TryRecvError::Disconnected) => ended = true,
                Err(TryRecvError::Empty) => {}
            }
        }
        let Some(cache) = &state.cache else { continue };
        if let Some(node) = cache.get(&syncer.own) {
            own(node);
        }
        if todo.sync {
            syncer.sync_logged(&cache.nodes(), &mut state.deleted, todo.stale);
        }
        if ended {
            break;
        }
    }
    log::error!("the watch of the nodes stopped");
}

struct State {
    cache: Option<NodeCache>,
    /// Pod CIDRs of nodes whose DELETED event came: their routes go even when the rest of the
    /// picture is in doubt.
    deleted: BTreeSet<ipnetwork::IpNetwork>,
    /// The last failure, until a watch resumes.
    failure: Option<String>,
    /// A list was just synced: the watch that follows it needs no check of its own.
    listed: bool,
    round: Duration,
}

#[derive(Default)]
struct Todo {
    sync: bool,
    stale: Option<&'static str>,
}

impl State {
    fn take(&mut self, update: Update<Node>, todo: &mut Todo) {
        match update {
            Update::Listed(nodes) => {
                self.cache = Some(NodeCache::new(nodes));
                self.listed = true;
                // A complete list: what the watch failures said no longer matters.
                *todo = Todo { sync: true, stale: None };
            }
            Update::Applied(node) => {
                if let Some(cache) = &mut self.cache {
                    todo.sync |= cache.apply(node);
                }
            }
            Update::Deleted(node) => {
                if let Some(cache) = &mut self.cache {
                    self.deleted.extend(pod_cidrs(&cache.delete(node)));
                    todo.sync = true;
                }
            }
            // The previous watch ended (its round, or a failure): the routes are checked again
            // (one deleted by hand comes back) as the watch goes on.
            Update::Resumed { version, lasted } => {
                // The server ends a watch at its round; earlier, the connection dropped.
                let dropped = lasted.filter(|l| *l + Duration::from_secs(1) < self.round);
                if let Some(why) = self.failure.take() {
                    log::info!("watching nodes: resuming from resource version {version} after: {why}");
                } else if let Some(lasted) = dropped {
                    log::info!(
                        "watching nodes: the watch ended after {lasted:.1?}: resuming from resource version {version}"
                    );
                }
                todo.sync |= !std::mem::take(&mut self.listed);
            }
            Update::Failed { listing: true, error } => {
                log::error!("listing nodes failed: {error}; no route removed; trying again after a backoff");
                self.failure = Some(error);
            }
            Update::Failed { listing: false, error } => {
                log::warn!("watching nodes: {error}; resuming after a backoff");
                self.failure = Some(error);
                self.listed = false;
                *todo = Todo { sync: self.cache.is_some(), stale: Some("the watch failed") };
            }
        }
    }
}
