//! A fake Kubernetes API server in a node's namespace, driven step by step by the test: each
//! connection's request comes out of [`FakeApi::request`], and what is answered on it is told with
//! [`FakeApi::say`] (which may come before the request: it waits in line). So a test can serve a
//! list, then stream watch events one at a time, checking the agent between them, and cut the
//! connection where it likes.
use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddrV4, TcpStream},
    sync::mpsc::{Receiver, Sender, channel},
    time::Duration,
};

use serde_json::Value;

use crate::traffic;

/// What the server does next on the open connection.
pub enum Say {
    /// A whole JSON answer; the connection is closed after it.
    Json(String),
    /// The head of a watch's answer (200, chunked): events follow.
    Open,
    /// One watch event (a line of JSON), in its own chunk.
    Event(Value),
    /// The connection drops in the middle of an event: half of it, then closed.
    Cut(Value),
    /// The server ends the watch (its timeout): the last chunk, then closed.
    End,
}

pub struct FakeApi {
    requests: Receiver<String>,
    says: Sender<Say>,
}

impl FakeApi {
    pub fn start(netns: &str, at: SocketAddrV4) -> Self {
        let listener = traffic::tcp_listener(netns, at).expect("listening as the API server");
        let (request_tx, requests) = channel();
        let (says, say_rx) = channel::<Say>();
        // Ends when the test drops the FakeApi while a connection waits for what to say.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let Some(request) = read_request(&mut stream) else { continue };
                if request_tx.send(request).is_err() {
                    return;
                }
                loop {
                    let Ok(say) = say_rx.recv() else { return };
                    // The client may be gone already: what it missed no longer matters.
                    if !answer(&mut stream, say) {
                        let _ = stream.shutdown(Shutdown::Both);
                        break;
                    }
                }
            }
        });
        Self { requests, says }
    }

    pub fn say(&self, say: Say) {
        self.says.send(say).expect("the fake API server stopped");
    }

    /// The next connection's request (line and headers), waiting up to 10 s for it.
    pub fn request(&self) -> String {
        self.requests.recv_timeout(Duration::from_secs(10)).expect("no request came to the fake API server")
    }
}

/// Writes `say`; whether the connection stays open.
fn answer(stream: &mut TcpStream, say: Say) -> bool {
    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
    let (text, open) = match say {
        Say::Json(body) => (
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            false,
        ),
        Say::Open => {
            ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".into(), true)
        }
        Say::Event(event) => (chunk(&format!("{event}\n")), true),
        Say::Cut(event) => {
            let line = format!("{event}\n");
            (format!("{:x}\r\n{}", line.len(), &line[..line.len() / 2]), false)
        }
        Say::End => ("0\r\n\r\n".into(), false),
    };
    let written = stream.write_all(text.as_bytes()).and_then(|()| stream.flush());
    written.is_ok() && open
}

pub(crate) fn read_request(stream: &mut TcpStream) -> Option<String> {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut request = Vec::new();
    let mut buf = [0; 4096];
    while !request.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        request.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(request).ok()
}

/// A request's line, read back: what kube's client asked for, whatever order its query
/// parameters come in.
#[derive(Debug)]
pub struct ApiRequest {
    pub method: String,
    pub path: String,
    /// Query parameters, percent-decoded.
    pub query: std::collections::BTreeMap<String, String>,
}

impl ApiRequest {
    pub fn parse(request: &str) -> Self {
        let line = request.lines().next().unwrap_or_default();
        let mut words = line.split(' ');
        let method = words.next().unwrap_or_default().to_string();
        let target = words.next().unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let query =
            query.split('&').filter_map(|pair| pair.split_once('=')).map(|(k, v)| (decode(k), decode(v))).collect();
        Self { method, path: path.to_string(), query }
    }
}

fn decode(text: &str) -> String {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
