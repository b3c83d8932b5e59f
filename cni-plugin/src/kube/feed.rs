//! The agent's watches, run by kube's watcher (list, then watch from the list's resource version,
//! bookmarks, a new list on 410 Gone, backoff after failures) on a thread of their own, and
//! handed to the agent's loops as plain [`Update`]s over channels: those loops stay synchronous
//! (netlink, BPF maps), and a burst of events is drained and handled at once.
use std::{fmt::Debug, sync::mpsc::Sender, time::Duration};

use anyhow::Result;
use futures::{StreamExt as _, future::BoxFuture};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;

use super::{
    client::{Target, client},
    rounds::Rounds,
};

/// What a watch tells its consumer.
#[derive(Debug)]
pub enum Update<K> {
    /// A complete list (the first, or a new one after 410 Gone): anything not in it is gone.
    Listed(Vec<K>),
    Applied(K),
    /// The object's last state.
    Deleted(K),
    /// A watch request went out from this resource version: the previous one ended after
    /// `lasted` (`None`: the first watch after a list).
    Resumed {
        version: String,
        lasted: Option<Duration>,
    },
    /// A list (`listing`) or a watch failed; the watcher tries again after its backoff.
    Failed {
        listing: bool,
        error: String,
    },
}

impl<K> Update<K> {
    /// Hands the update to `model`'s handler for its kind (`what`, for the log); whether it
    /// was a complete list.
    pub fn apply_to<M>(
        self,
        what: &str,
        model: &mut M,
        list: fn(&mut M, Vec<K>),
        apply: fn(&mut M, &K),
        delete: fn(&mut M, &K),
    ) -> bool {
        match self {
            Update::Listed(objects) => {
                list(model, objects);
                return true;
            }
            Update::Applied(object) => apply(model, &object),
            Update::Deleted(object) => delete(model, &object),
            Update::Failed { error, .. } => log::warn!("watching {what}: {error}"),
            Update::Resumed { .. } => {}
        }
        false
    }
}

pub struct Feed {
    runtime: tokio::runtime::Runtime,
    client: Client,
    rounds: Rounds,
    /// Each watch's seconds (`timeoutSeconds`): the server ends it then, and the next starts.
    round: u32,
    tasks: Vec<BoxFuture<'static, ()>>,
}

impl Feed {
    pub fn new(target: Target<'_>, round: Duration) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let rounds = Rounds::default();
        // A read that waits past the round's end means a dead connection (as the watcher's own
        // idle limit, the round plus 5 s, would find too).
        let client = runtime.block_on(client(target, round + Duration::from_secs(15), &rounds))?;
        let round = u32::try_from(round.as_secs()).unwrap_or(u32::MAX);
        Ok(Self { runtime, client, rounds, round, tasks: Vec::new() })
    }

    /// Watches every object of kind `K`, sending `wrap(update)` to `to`.
    pub fn watch<K, T>(&mut self, to: Sender<T>, wrap: fn(Update<K>) -> T)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
        T: Send + 'static,
    {
        let api: Api<K> = Api::all(self.client.clone());
        let path = K::url_path(&(), None);
        let notes = to.clone();
        self.rounds.listen(path.clone(), move |version, lasted| {
            let _ = notes.send(wrap(Update::Resumed { version, lasted }));
        });
        let config = watcher::Config::default().timeout(self.round);
        self.tasks.push(Box::pin(follow(api, config, path, move |u| to.send(wrap(u)).is_ok())));
    }

    /// Runs the watches on a thread of their own until the process ends.
    pub fn start(self) {
        let Self { runtime, tasks, .. } = self;
        std::thread::spawn(move || runtime.block_on(futures::future::join_all(tasks)));
    }
}

/// One kind's watch, for as long as `send` finds someone listening.
async fn follow<K>(api: Api<K>, config: watcher::Config, path: String, send: impl Fn(Update<K>) -> bool)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        let mut events = watcher(api.clone(), config.clone()).default_backoff().boxed();
        let mut listed: Option<Vec<K>> = None;
        while let Some(event) = events.next().await {
            let update = match event {
                Ok(watcher::Event::Init) => {
                    listed = Some(Vec::new());
                    continue;
                }
                Ok(watcher::Event::InitApply(object)) => {
                    listed.get_or_insert_with(Vec::new).push(object);
                    continue;
                }
                Ok(watcher::Event::InitDone) => Update::Listed(listed.take().unwrap_or_default()),
                Ok(watcher::Event::Apply(object)) => Update::Applied(object),
                Ok(watcher::Event::Delete(object)) => Update::Deleted(object),
                Err(e) => {
                    let listing = matches!(e, watcher::Error::InitialListFailed(_));
                    // The watcher takes 410 Gone as a watch event to mean "list again", but
                    // not as the status of the watch request itself: it would retry that
                    // version forever. A new watcher starts with a new list.
                    let gone = matches!(&e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 410);
                    if !send(Update::Failed { listing, error: e.to_string() }) {
                        return;
                    }
                    if gone {
                        log::info!("{path}: the watch cannot resume (410 Gone): listing again");
                        break;
                    }
                    continue;
                }
            };
            if !send(update) {
                return;
            }
        }
    }
}
