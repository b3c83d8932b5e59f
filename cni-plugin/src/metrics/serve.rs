//! `GET /metrics` over HTTP/1.1, on a thread of its own: just enough of the protocol for a
//! Prometheus scrape (one request per connection, then close). Connections are served one at a
//! time; a client that sends nothing holds the thread for [`TIMEOUT`] at most.
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    panic::{AssertUnwindSafe, catch_unwind},
    thread,
    time::Duration,
};

use anyhow::{Context as _, Result};

use super::exposition::CONTENT_TYPE;

/// How long one client may take to send its request or read the answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a request that is read: a scrape's headers are a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;

/// Binds `addr` now (so that a taken port fails the caller at start) and answers on a thread;
/// `page` builds the exposition text for each scrape. Returns the address bound.
pub fn spawn(addr: SocketAddr, page: impl Fn() -> String + Send + 'static) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("listening on {addr} for metrics"))?;
    let bound = listener.local_addr()?;
    thread::Builder::new().name("metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(stream) => {
                    if let Err(e) = answer(stream, &page) {
                        log::debug!("metrics: {e:#}");
                    }
                }
                // Out of descriptors, say: the route watch matters more; try again shortly.
                Err(e) => {
                    log::warn!("metrics: accepting a connection: {e}");
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, page: &impl Fn() -> String) -> Result<()> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let head = read_head(&mut stream)?;
    let request_line = head.lines().next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let path = target.split('?').next().unwrap_or_default();
    let response = match (method, path) {
        ("GET" | "HEAD", "/metrics") => match catch_unwind(AssertUnwindSafe(page)) {
            Ok(body) => Response::new("200 OK", CONTENT_TYPE, body),
            // A bug in a collector costs that scrape, not the agent.
            Err(_) => Response::text("500 Internal Server Error", "collecting the metrics failed\n"),
        },
        ("GET" | "HEAD", _) => Response::text("404 Not Found", "not found: the metrics are at /metrics\n"),
        _ if words.next().is_some_and(|v| v.starts_with("HTTP/")) => {
            Response::text("405 Method Not Allowed", "only GET and HEAD\n")
        }
        _ => Response::text("400 Bad Request", "not an HTTP request\n"),
    };
    stream.write_all(&response.bytes(method == "HEAD"))?;
    Ok(())
}

/// The request line and headers (up to the blank line); a body, if any, is never read.
fn read_head(stream: &mut TcpStream) -> Result<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        anyhow::ensure!(head.len() < MAX_REQUEST, "request head over {MAX_REQUEST} bytes");
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the request"),
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn new(status: &'static str, content_type: &'static str, body: String) -> Self {
        Self { status, content_type, body }
    }

    fn text(status: &'static str, body: &str) -> Self {
        Self::new(status, "text/plain; charset=utf-8", body.into())
    }

    /// Status line, headers and (unless for HEAD) the body. `Connection: close`: one request
    /// per connection keeps the server a loop without state.
    fn bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if self.status.starts_with("405") {
            out.push_str("Allow: GET, HEAD\r\n");
        }
        out.push_str("\r\n");
        if !head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{Shutdown, SocketAddr, TcpStream},
    };

    fn ask(at: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(at).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let _ = stream.shutdown(Shutdown::Write);
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn serves_the_page_at_metrics_only() {
        let at = super::spawn("127.0.0.1:0".parse().unwrap(), || "up 1\n".to_string()).unwrap();
        let ok = ask(at, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{ok}");
        assert!(ok.contains("\r\nContent-Length: 5\r\n") && ok.ends_with("\r\n\r\nup 1\n"), "{ok}");
        let query = ask(at, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(query.starts_with("HTTP/1.1 200 OK\r\n"), "{query}");
        let head = ask(at, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(ask(at, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found\r\n"));
        let post = ask(at, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n") && post.contains("\r\nAllow: GET, HEAD\r\n"));
        assert!(ask(at, "hello\n\n").starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(ask(at, "").starts_with("HTTP/1.1 400 Bad Request\r\n"), "a client that says nothing");
    }

    #[test]
    fn a_panicking_collector_costs_one_scrape() {
        let at = super::spawn("127.0.0.1:0".parse().unwrap(), || panic!("collector bug")).unwrap();
        for _ in 0..2 {
            assert!(ask(at, "GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 500 "));
        }
    }

    #[test]
    fn a_taken_port_fails_at_start() {
        let at = super::spawn("127.0.0.1:0".parse().unwrap(), String::new).unwrap();
        let e = super::spawn(at, String::new).unwrap_err();
        assert!(format!("{e:#}").contains(&format!("listening on {at} for metrics")), "{e:#}");
    }
}
