//! The control plane's HTTP listener (`serve --http-listen`, loopback port
//! 9465 by default, `off` for none): plain HTTP/1.1 for probes and
//! scrapers, nothing an operator or a node needs to work.
//!
//! - `GET /healthz`: 200 while the process runs; touches nothing else.
//! - `GET /readyz`: 200 when [`ready::Readiness`] holds (start-up done,
//!   the store reachable and migrated, the gateway lease held); 503 with
//!   one line per reason otherwise.
//! - `GET /metrics`: [`crate::metrics`] in the Prometheus text format.
//!
//! It is bound before the store is opened, so `/healthz` answers (and
//! `/readyz` says why not) during start-up. A peer cannot pin it: at most
//! [`MAX_CONNECTIONS`] connections at once (more are closed on accept),
//! request heads within [`HEAD_TIMEOUT`] and [`MAX_HEAD`] bytes, and each
//! connection closed after [`CONNECTION_LIMIT`] whatever it does.

pub mod bounded;
pub mod ready;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::info;

use crate::metrics::{CONTENT_TYPE, ServerMetrics};
use ready::Readiness;

/// Where `--http-listen` listens by default: loopback, one port above the
/// node's metrics (9464), so a node and the control plane share a host.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9465";
/// Connections served at once; more are closed as they are accepted.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections from one address at once (a prober, a scraper).
pub const MAX_PER_ADDRESS: usize = 16;
/// A request head must arrive within this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a request head may take (hyper's smallest buffer).
pub const MAX_HEAD: usize = 8192;
/// No connection lives longer than this.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(30);

/// `--http-listen`: an address, or `off`.
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    match s.trim() {
        "off" | "none" | "" => Ok(None),
        a => a.parse().map(Some).map_err(|_| {
            format!("--http-listen takes an address such as {DEFAULT_LISTEN}, or off; not {s:?}")
        }),
    }
}

/// What the listener answers from.
#[derive(Debug, Clone)]
pub struct Observed {
    pub metrics: Arc<ServerMetrics>,
    pub readiness: Arc<Readiness>,
}

type Reply = bounded::Reply;

fn reply(status: StatusCode, kind: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(bounded::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
    r
}

const TEXT: &str = "text/plain; charset=utf-8";

/// Answers one request.
pub fn answer(o: &Observed, method: &Method, path: &str) -> Reply {
    if method != Method::GET && method != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET or HEAD\n");
    }
    match path {
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => {
            let why = o.readiness.why_not();
            if why.is_empty() {
                reply(StatusCode::OK, TEXT, "ready\n")
            } else {
                let mut body = String::from("not ready\n");
                for w in why {
                    body.push_str(&w);
                    body.push('\n');
                }
                reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, body)
            }
        }
        "/metrics" => reply(StatusCode::OK, CONTENT_TYPE, o.metrics.encode()),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: this listener serves /healthz, /readyz and /metrics\n",
        ),
    }
}

/// Binds `addr`; [`serve`] answers on the listener.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {addr} for /healthz, /readyz and /metrics: {e} \
             (choose another with --http-listen ADDR, or --http-listen off)"
        )
    })
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, observed: Observed) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "http listener: /healthz, /readyz, /metrics");
    }
    let limits = bounded::Limits {
        max_connections: MAX_CONNECTIONS,
        max_per_address: MAX_PER_ADDRESS,
        head_timeout: HEAD_TIMEOUT,
        max_head: MAX_HEAD,
        connection_limit: Some(CONNECTION_LIMIT),
    };
    let handler: bounded::Handler = Arc::new(move |_peer, req: Request<hyper::body::Incoming>| {
        let r = answer(&observed, req.method(), req.uri().path());
        Box::pin(async move { r })
    });
    bounded::serve(listener, "http listener", limits, handler).await
}

#[cfg(test)]
mod tests {
    use super::ready::StoreState;
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn observed() -> Observed {
        Observed {
            metrics: Arc::new(ServerMetrics::new()),
            readiness: Arc::new(Readiness::new()),
        }
    }

    #[test]
    fn listen_takes_an_address_or_off() {
        assert_eq!(parse_listen("off"), Ok(None));
        assert_eq!(
            parse_listen(DEFAULT_LISTEN),
            Ok(Some("127.0.0.1:9465".parse().unwrap()))
        );
        assert!(parse_listen("localhost").unwrap_err().contains("or off"));
    }

    #[test]
    fn routes_answer_as_probes_expect() {
        let o = observed();
        assert_eq!(
            answer(&o, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&o, &Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        o.readiness.started();
        o.readiness.set_store(StoreState::Ready);
        o.readiness.watch_lease(Box::new(|| true));
        assert_eq!(answer(&o, &Method::GET, "/readyz").status(), StatusCode::OK);
        let m = answer(&o, &Method::GET, "/metrics");
        assert_eq!(m.headers()[hyper::header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(
            answer(&o, &Method::POST, "/healthz").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            answer(&o, &Method::GET, "/").status(),
            StatusCode::NOT_FOUND
        );
    }

    /// A client that sends half a head and stalls is cut off, and the
    /// connections over the limit are closed at once; the listener keeps
    /// answering others meanwhile.
    #[tokio::test]
    async fn slow_and_surplus_clients_cannot_pin_it() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, observed()));
        let mut stalled = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            stalled.push(s);
        }
        // Over the limit: closed without an answer.
        let mut surplus = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = surplus
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut out = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(3), surplus.read_to_end(&mut out))
            .await
            .expect("closed at once");
        assert!(n.is_err() || out.is_empty(), "{out:?}");
        // The stalled ones are cut off after the head timeout.
        let start = std::time::Instant::now();
        let mut first = stalled.remove(0);
        let mut out = Vec::new();
        let _ = tokio::time::timeout(HEAD_TIMEOUT * 3, first.read_to_end(&mut out))
            .await
            .expect("the stalled client is cut off");
        assert!(start.elapsed() < HEAD_TIMEOUT * 2);
        drop(stalled);
        // Slots come back: a normal request is answered.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out).await;
            if out.starts_with("HTTP/1.1 200 OK") {
                assert!(out.ends_with("ok\n"), "{out}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no answer: {out:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
