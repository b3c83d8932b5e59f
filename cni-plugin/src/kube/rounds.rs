//! A middleware on kube's client that sees each watch request go out. kube's watcher starts the
//! next watch by itself when one ends (the server's `timeoutSeconds`, a dropped connection), and
//! says nothing of it; the agent, though, checks its routes again at the end of every round, and
//! says from which resource version it resumes after a failure. A watch request from version V
//! for path P is exactly that news, so it is handed to whoever registered P, with how long the
//! previous watch of P lasted: one that ended well before its round was dropped (kube's watcher
//! takes a connection cut between two events for a normal end).
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::Request;
use tower::{Layer, Service};

/// Told the version a watch starts from, and how long the previous one lasted (`None`: the
/// first after a list).
type Note = Box<dyn Fn(String, Option<Duration>) + Send>;

/// Collection path (`/api/v1/nodes`) → its listener, and when its last watch started.
type Listeners = HashMap<String, (Note, Option<Instant>)>;

#[derive(Clone, Default)]
pub struct Rounds {
    listeners: Arc<Mutex<Listeners>>,
}

impl Rounds {
    pub fn listen(&self, path: String, note: impl Fn(String, Option<Duration>) + Send + 'static) {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner()).insert(path, (Box::new(note), None));
    }

    fn seen(&self, uri: &http::Uri) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        let Some((note, last)) = listeners.get_mut(uri.path()) else { return };
        match watch_version(uri) {
            Some(version) => {
                let lasted = last.replace(Instant::now()).map(|t| t.elapsed());
                note(version, lasted);
            }
            // A list: the next watch is the first after it.
            None => *last = None,
        }
    }
}

/// The resource version a watch request resumes from; `None` for anything but a watch.
fn watch_version(uri: &http::Uri) -> Option<String> {
    let mut watch = false;
    let mut version = None;
    for pair in uri.query()?.split('&') {
        match pair.split_once('=') {
            Some(("watch", v)) => watch = v == "true" || v == "1",
            Some(("resourceVersion", v)) => version = Some(unescape(v)),
            _ => {}
        }
    }
    version.filter(|_| watch)
}

/// Resource versions are opaque: kube percent-encodes them, the log shows them as sent.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl<S> Layer<S> for Rounds {
    type Service = Noted<S>;

    fn layer(&self, inner: S) -> Noted<S> {
        Noted { inner, rounds: self.clone() }
    }
}

#[derive(Clone)]
pub struct Noted<S> {
    inner: S,
    rounds: Rounds,
}

impl<S: Service<Request<B>>, B> Service<Request<B>> for Noted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.rounds.seen(request.uri());
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;

    use super::*;

    #[test]
    fn notes_watches_of_registered_paths_only() {
        let rounds = Rounds::default();
        let (tx, rx) = channel();
        rounds.listen("/api/v1/nodes".into(), move |v, lasted| tx.send((v, lasted.is_some())).unwrap());
        let uri = |u: &str| u.parse::<http::Uri>().unwrap();
        rounds.seen(&uri("http://a/api/v1/nodes?&limit=500"));
        rounds.seen(&uri("http://a/api/v1/services?&watch=true&resourceVersion=9"));
        rounds.seen(&uri("http://a/api/v1/nodes?&watch=true&timeoutSeconds=30&resourceVersion=a%2Fb+c"));
        rounds.seen(&uri("http://a/api/v1/nodes?&watch=true&resourceVersion=12"));
        rounds.seen(&uri("http://a/api/v1/nodes?&limit=500"));
        rounds.seen(&uri("http://a/api/v1/nodes?&watch=true&resourceVersion=20"));
        let notes: Vec<_> = rx.try_iter().collect();
        assert_eq!(notes, [("a/b c".into(), false), ("12".into(), true), ("20".into(), false)]);
    }
}
