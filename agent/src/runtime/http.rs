//! The local HTTP endpoint: `/metrics` (Prometheus), `/healthz` (the main
//! loop is alive), `/readyz` (registered and probing), `/status` (JSON for
//! `clockmesh status`). A minimal HTTP/1.1 server: GET only, one request per
//! connection, small bounded reads.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tracing::{debug, warn};

use super::status::Status;
use crate::publish::realtime_now_ns;

/// The main loop is unhealthy when it has not run for this long.
pub const HEALTH_TIMEOUT_NS: i64 = 10_000_000_000;
const MAX_REQUEST: usize = 8192;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub type SharedStatus = Arc<Mutex<Status>>;

/// Binds `addr`; the returned future serves until dropped.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 32;
/// Pause after a failed `accept` (EMFILE, ENFILE, ENOBUFS…): retrying at
/// once would spin a core while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

pub async fn serve(listener: TcpListener, status: SharedStatus) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A slot first: past the cap, connections wait in the backlog.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!("http accept failed: {e}; retrying in {ACCEPT_BACKOFF:?}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let status = status.clone();
        tokio::spawn(async move {
            if let Err(e) = tokio::time::timeout(IO_TIMEOUT, handle(stream, status)).await {
                debug!("http connection timed out: {e}");
            }
            drop(slot);
        });
    }
}

async fn handle(mut stream: TcpStream, status: SharedStatus) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let snapshot = status.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (code, ctype, body) = respond(method, path, &snapshot, realtime_now_ns().0);
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// A blocking GET against an agent's endpoint: (status code, body). For
/// `clockmesh status` and the tests; one request per connection.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| match e.kind() {
        // A read timeout surfaces as EAGAIN ("os error 11"): say what it means.
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", IO_TIMEOUT.as_secs()),
        ),
        _ => e,
    })?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("malformed HTTP response: {head:?}")))?;
    Ok((code, body.to_owned()))
}

/// (status line, content type, body) for a request.
pub fn respond(
    method: &str,
    path: &str,
    s: &Status,
    now_ns: i64,
) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != "GET" {
        return ("405 Method Not Allowed", TEXT, "GET only\n".into());
    }
    let path = path.split('?').next().unwrap_or("");
    match path {
        "/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            s.to_prometheus(),
        ),
        "/status" => (
            "200 OK",
            "application/json",
            serde_json::to_string_pretty(&s.at(now_ns)).unwrap_or_default(),
        ),
        "/healthz" if now_ns - s.last_tick_ns <= HEALTH_TIMEOUT_NS => {
            ("200 OK", TEXT, "ok\n".into())
        }
        "/healthz" => (
            "503 Service Unavailable",
            TEXT,
            "main loop stalled\n".into(),
        ),
        "/readyz" if s.ready => ("200 OK", TEXT, "ready\n".into()),
        "/readyz" => ("503 Service Unavailable", TEXT, "not ready\n".into()),
        _ => (
            "404 Not Found",
            TEXT,
            "try /metrics /status /healthz /readyz\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_answer_by_state() {
        let mut s = Status {
            last_tick_ns: 100,
            ..Default::default()
        };
        assert_eq!(respond("GET", "/healthz", &s, 200).0, "200 OK");
        assert!(
            respond("GET", "/healthz", &s, 100 + HEALTH_TIMEOUT_NS + 1)
                .0
                .starts_with("503")
        );
        assert!(respond("GET", "/readyz", &s, 0).0.starts_with("503"));
        s.ready = true;
        assert_eq!(respond("GET", "/readyz?verbose", &s, 0).0, "200 OK");
        assert!(respond("POST", "/metrics", &s, 0).0.starts_with("405"));
        assert!(respond("GET", "/nope", &s, 0).0.starts_with("404"));
        let (_, ctype, body) = respond("GET", "/status", &s, 0);
        assert_eq!(ctype, "application/json");
        assert!(serde_json::from_str::<Status>(&body).unwrap().ready);
    }

    #[test]
    fn serves_over_tcp() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            let addr = listener.local_addr().unwrap();
            let status = Arc::new(Mutex::new(Status {
                node: "n1".into(),
                ..Default::default()
            }));
            tokio::spawn(serve(listener, status));
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
            assert!(out.contains("clockmesh_up{node=\"n1\"}"), "{out}");
            let body = out.split("\r\n\r\n").nth(1).unwrap_or_default();
            let scrape = crate::runtime::status::parse_prometheus(body);
            assert!(scrape.samples.iter().any(|x| x.metric == "clockmesh_ready"));
        });
    }

    #[tokio::test]
    async fn connections_past_the_cap_wait_until_one_ends() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Mutex::new(Status::default()))));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap()); // never sends
        }
        let get = |mut c: TcpStream| async move {
            c.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.map(|_| out)
        };
        let waiting = tokio::spawn(get(TcpStream::connect(addr).await.unwrap()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "served past the cap");
        drop(idle.pop()); // its handler sees EOF and frees a slot
        let out = tokio::time::timeout(Duration::from_secs(3), waiting)
            .await
            .expect("served once a slot was free")
            .unwrap()
            .unwrap();
        assert!(out.starts_with("HTTP/1.1"), "{out}");
    }

    #[tokio::test]
    async fn clients_that_never_send_are_dropped_after_the_io_timeout() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Mutex::new(Status::default()))));
        // Every slot held by a client that never sends a request.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = String::new();
        // Served once the silent ones time out: nobody freed a slot.
        tokio::time::timeout(IO_TIMEOUT * 2, c.read_to_string(&mut out))
            .await
            .expect("a slow client held its slot past the I/O timeout")
            .unwrap();
        assert!(out.starts_with("HTTP/1.1"), "{out}");
        let mut byte = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut byte))
            .await
            .expect("the silent client's connection is closed")
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
    }
}
