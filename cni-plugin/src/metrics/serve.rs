//! `GET /metrics` over HTTP/1.1 with hyper, on a thread of its own running a small tokio runtime
//! (the rest of the agent is threads that block). Each connection is a task of its own, so a slow
//! client holds only its own: it has [`DEADLINE`] for its whole request and answer (not per read,
//! so a byte every few seconds does not keep it), and at most [`MAX_CONNECTIONS`] are served at
//! once; beyond that a new connection is closed at accept rather than queued.
use std::{convert::Infallible, net::SocketAddr, sync::Arc, thread, time::Duration};

use anyhow::{Context as _, Result};
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
};

use super::exposition::CONTENT_TYPE;

/// How long one connection may take, from accept to the last byte of the answer.
const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once (and collectors running: see [`answer`]). A scrape is one.
const MAX_CONNECTIONS: usize = 64;
/// hyper's smallest read buffer, which also bounds a request's head: a scrape's is a few hundred
/// bytes.
const MAX_REQUEST: usize = 8 * 1024;

#[derive(Clone, Copy)]
struct Limits {
    deadline: Duration,
    connections: usize,
}

/// Binds `addr` now (so that a taken port fails the caller at start) and answers on a thread;
/// `page` builds the exposition text for each scrape. Returns the address bound.
pub fn spawn(addr: SocketAddr, page: impl Fn() -> String + Send + Sync + 'static) -> Result<SocketAddr> {
    spawn_with(addr, Limits { deadline: DEADLINE, connections: MAX_CONNECTIONS }, page)
}

fn spawn_with(
    addr: SocketAddr,
    limits: Limits,
    page: impl Fn() -> String + Send + Sync + 'static,
) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("listening on {addr} for metrics"))?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let listener = {
        let _in_runtime = runtime.enter();
        TcpListener::from_std(listener)?
    };
    let page = Arc::new(page);
    thread::Builder::new().name("metrics".into()).spawn(move || runtime.block_on(serve(listener, limits, page)))?;
    Ok(bound)
}

async fn serve<F: Fn() -> String + Send + Sync + 'static>(listener: TcpListener, limits: Limits, page: Arc<F>) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of descriptors, say: the route watch matters more; try again shortly.
            Err(e) => {
                log::warn!("metrics: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // All slots taken: dropping the stream closes it now, so the client is told at once.
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            log::debug!("metrics: {} connections already, one more closed", limits.connections);
            continue;
        };
        let (slot, page) = (Arc::new(slot), Arc::clone(&page));
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(request, Arc::clone(&page), Arc::clone(&slot)));
            let connection = http1::Builder::new()
                // One request per connection, then close: the deadline is then the request's.
                .keep_alive(false)
                // A client that shuts down its side once it has asked (`nc -N`) still gets the answer.
                .half_close(true)
                // `Content-Type`, not `content-type`: as the hand-written server wrote them.
                .title_case_headers(true)
                .max_buf_size(MAX_REQUEST)
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection at the deadline closes it, whatever it was waiting for.
            match tokio::time::timeout(limits.deadline, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => log::debug!("metrics: {e}"),
                Err(_) => log::debug!("metrics: a client cut off at the {:?} deadline", limits.deadline),
            }
        });
    }
}

async fn answer<F: Fn() -> String + Send + Sync + 'static>(
    request: Request<Incoming>,
    page: Arc<F>,
    slot: Arc<OwnedSemaphorePermit>,
) -> Result<Response<String>, Infallible> {
    let (get_or_head, path) = (matches!(*request.method(), Method::GET | Method::HEAD), request.uri().path());
    Ok(match (get_or_head, path) {
        // The collector reads pins with blocking syscalls: off the runtime's one thread. It holds
        // the connection's slot until it returns, even when the connection is gone, so that
        // clients that ask and leave cannot pile up collectors. hyper leaves out the body for HEAD.
        (true, "/metrics") => match tokio::task::spawn_blocking(move || {
            let _slot = slot;
            page()
        })
        .await
        {
            Ok(body) => reply(StatusCode::OK, CONTENT_TYPE, body),
            // A bug in a collector costs that scrape, not the agent.
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "collecting the metrics failed\n"),
        },
        (true, _) => text(StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n"),
        (false, _) => {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
            response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            response
        }
    })
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, body: &str) -> Response<String> {
    reply(status, "text/plain; charset=utf-8", body.into())
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{Shutdown, SocketAddr, TcpStream},
        thread::sleep,
        time::{Duration, Instant},
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
        assert!(query.starts_with("HTTP/1.0 200 OK\r\n"), "{query}");
        let head = ask(at, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(ask(at, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found\r\n"));
        let post = ask(at, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n") && post.contains("\r\nAllow: GET, HEAD\r\n"));
        assert!(ask(at, "hello\n\n").starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert_eq!(ask(at, ""), "", "a client that says nothing is not answered");
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

    #[test]
    fn slow_clients_are_bounded_in_time_and_number() {
        let limits = super::Limits { deadline: Duration::from_millis(500), connections: 2 };
        let at = super::spawn_with("127.0.0.1:0".parse().unwrap(), limits, || "up 1\n".to_string()).unwrap();
        let started = Instant::now();
        let mut slow: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(at).unwrap()).collect();
        sleep(Duration::from_millis(100));
        // Both slots taken: one more is closed at once, not queued.
        let mut third = TcpStream::connect(at).unwrap();
        third.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        assert!(matches!(third.read(&mut [0; 16]), Ok(0)), "a connection over the bound was kept");
        // A byte every 100 ms, the headers never ended: cut off at the deadline all the same.
        for stream in &mut slow {
            stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\n");
        }
        while !slow.is_empty() {
            assert!(started.elapsed() < Duration::from_secs(1), "slow clients kept {:?}", started.elapsed());
            slow.retain_mut(|s| {
                s.write_all(b"a").is_ok()
                    && s.read(&mut [0; 16]).is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
            });
        }
        assert!(ask(at, "GET /metrics HTTP/1.1\r\n\r\n").ends_with("\r\n\r\nup 1\n"), "the slots are free again");
    }
}
