//! A fake API server that keeps objects, as the real one does, rather than being scripted step
//! by step ([`crate::FakeApi`]): the test puts and deletes objects, and every client's lists and
//! watches (concurrent, one connection each) are served from them in the API's own JSON, with
//! resource versions, ADDED/MODIFIED/DELETED/BOOKMARK events, a watch's end after its
//! `timeoutSeconds`, and 410 Gone for a version older than the last compaction.
use std::{
    collections::BTreeMap,
    io::Write as _,
    net::{Shutdown, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant, SystemTime},
};

use serde_json::{Value, json};

use crate::{ApiRequest, fake_api::read_request, traffic};

pub const NODES: &str = "/api/v1/nodes";
pub const SERVICES: &str = "/api/v1/services";
pub const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
pub const PODS: &str = "/api/v1/pods";
pub const NAMESPACES: &str = "/api/v1/namespaces";
pub const NETWORK_POLICIES: &str = "/apis/networking.k8s.io/v1/networkpolicies";

struct Logged {
    version: u64,
    path: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    version: u64,
    /// (collection path, `namespace/name`) → the object as last written.
    objects: BTreeMap<(String, String), Value>,
    events: Vec<Logged>,
    /// Watches from this version or older get 410 Gone.
    compacted: u64,
    /// Bumped to drop every open watch.
    generation: u64,
    /// Every request served: path, whether a watch, the version it watched from, when.
    requests: Vec<(String, Option<String>, SystemTime)>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

pub struct FakeStore {
    shared: Arc<Shared>,
    /// The listening socket, shut down when the store is dropped: that ends its thread, which
    /// closes it, so a bench that starts a store per round keeps no socket (and no netns) alive.
    listener: TcpListener,
}

impl FakeStore {
    pub fn start(netns: &str, at: SocketAddrV4) -> Self {
        let listener = traffic::tcp_listener(netns, at).expect("listening as the API server");
        let own = listener.try_clone().expect("a second handle of the API server's socket");
        let shared = Arc::new(Shared { state: Mutex::default(), changed: Condvar::new() });
        let server = Arc::clone(&shared);
        // Ends when the store is dropped (accept then fails) or with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let shared = Arc::clone(&server);
                std::thread::spawn(move || {
                    if let Some(request) = read_request(&mut stream) {
                        serve(&shared, &mut stream, &ApiRequest::parse(&request));
                    }
                    let _ = stream.shutdown(Shutdown::Both);
                });
            }
        });
        Self { shared, listener: own }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates or replaces objects of the collection at `path`; the version of the last.
    pub fn put(&self, path: &str, objects: impl IntoIterator<Item = Value>) -> u64 {
        let mut state = self.state();
        for mut object in objects {
            state.version += 1;
            object["metadata"]["resourceVersion"] = json!(state.version.to_string());
            let key = (path.to_string(), name_of(&object));
            let kind = if state.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
            let version = state.version;
            state.events.push(Logged { version, path: path.to_string(), kind, object: object.clone() });
            state.objects.insert(key, object);
        }
        self.shared.changed.notify_all();
        state.version
    }

    pub fn delete(&self, path: &str, namespaced_name: &str) {
        let mut state = self.state();
        let Some(mut object) = state.objects.remove(&(path.to_string(), namespaced_name.to_string())) else {
            return;
        };
        state.version += 1;
        object["metadata"]["resourceVersion"] = json!(state.version.to_string());
        let version = state.version;
        state.events.push(Logged { version, path: path.to_string(), kind: "DELETED", object });
        self.shared.changed.notify_all();
    }

    /// A BOOKMARK on every open watch of `path`, at the current version.
    pub fn bookmark(&self, path: &str) {
        let mut state = self.state();
        let version = state.version;
        let object = json!({ "metadata": { "resourceVersion": version.to_string() } });
        state.events.push(Logged { version, path: path.to_string(), kind: "BOOKMARK", object });
        self.shared.changed.notify_all();
    }

    /// Forgets the history (etcd's compaction): open watches drop, and a watch from any version
    /// seen so far gets 410 Gone, so clients must list again.
    pub fn compact(&self) {
        let mut state = self.state();
        state.compacted = state.version;
        state.generation += 1;
        self.shared.changed.notify_all();
    }

    /// The requests for `path` so far: the version each watch started from (`None`: a list),
    /// and when it was served.
    pub fn requests(&self, path: &str) -> Vec<(Option<String>, SystemTime)> {
        self.state().requests.iter().filter(|(p, ..)| p == path).map(|(_, v, t)| (v.clone(), *t)).collect()
    }
}

fn name_of(object: &Value) -> String {
    let meta = &object["metadata"];
    match meta["namespace"].as_str() {
        Some(ns) => format!("{ns}/{}", meta["name"].as_str().unwrap_or_default()),
        None => meta["name"].as_str().unwrap_or_default().to_string(),
    }
}

fn list_kind(path: &str) -> (&'static str, &'static str) {
    match path {
        SLICES => ("EndpointSliceList", "discovery.k8s.io/v1"),
        SERVICES => ("ServiceList", "v1"),
        PODS => ("PodList", "v1"),
        NAMESPACES => ("NamespaceList", "v1"),
        NETWORK_POLICIES => ("NetworkPolicyList", "networking.k8s.io/v1"),
        _ => ("NodeList", "v1"),
    }
}

fn serve(shared: &Shared, stream: &mut TcpStream, request: &ApiRequest) {
    let watch = request.query.get("watch").is_some_and(|w| w == "true" || w == "1");
    if !watch {
        let body = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.requests.push((request.path.clone(), None, SystemTime::now()));
            let items: Vec<&Value> =
                state.objects.iter().filter(|((p, _), _)| *p == request.path).map(|(_, o)| o).collect();
            let (kind, api_version) = list_kind(&request.path);
            let meta = json!({ "resourceVersion": state.version.to_string() });
            json!({ "kind": kind, "apiVersion": api_version, "metadata": meta, "items": items }).to_string()
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
        return;
    }
    let from: u64 = request.query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let timeout = request.query.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(60);
    let until = Instant::now() + Duration::from_secs(timeout);
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let chunk = |stream: &mut TcpStream, event: &Value| {
        let line = format!("{event}\n");
        stream.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes()).is_ok()
    };
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    state.requests.push((request.path.clone(), Some(from.to_string()), SystemTime::now()));
    if from < state.compacted {
        drop(state);
        let gone = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                           "message": format!("too old resource version: {from}"), "code": 410 });
        let _ = chunk(stream, &json!({ "type": "ERROR", "object": gone }));
        let _ = stream.write_all(b"0\r\n\r\n");
        return;
    }
    let generation = state.generation;
    let mut next = state.events.partition_point(|e| e.version <= from);
    loop {
        let (kind, api_version) = list_kind(&request.path);
        let item_kind = kind.trim_end_matches("List");
        let batch: Vec<Value> = state.events[next..]
            .iter()
            .filter(|e| e.path == request.path)
            .map(|e| {
                let mut object = e.object.clone();
                object["kind"] = json!(item_kind);
                object["apiVersion"] = json!(api_version);
                json!({ "type": e.kind, "object": object })
            })
            .collect();
        next = state.events.len();
        drop(state);
        for event in &batch {
            if !chunk(stream, event) {
                return;
            }
        }
        let _ = stream.flush();
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.generation != generation {
            // Dropped: no last chunk, as a connection that broke.
            return;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(state);
            let _ = stream.write_all(b"0\r\n\r\n");
            return;
        }
        if next == state.events.len() {
            state = shared.changed.wait_timeout(state, left.min(Duration::from_millis(200))).unwrap().0;
        }
    }
}

impl Drop for FakeStore {
    fn drop(&mut self) {
        // shutdown(2) on a listening socket wakes a thread blocked in accept(2) with an error.
        // SAFETY: the descriptor is the listener's, open while `self` is.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}
