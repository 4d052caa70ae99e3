//! One bounded HTTP/1.1 server for the plain-HTTP listeners (the probe
//! listener and the boot endpoint): a peer cannot pin either. At most
//! `max_connections` at once (more are closed as they are accepted), each
//! request head (the first, and each next one on a kept-alive connection)
//! within `head_timeout` and `max_head` bytes, and, where set, no
//! connection older than `connection_limit`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::Request;
use hyper::body::{Bytes, Incoming};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

/// What a listener allows one peer.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// From one source address (an IPv6 address with its /64:
    /// `bcd_proto::tls::PerAddress`), so a flood from one address leaves
    /// room for everyone else.
    pub max_per_address: usize,
    pub head_timeout: Duration,
    pub max_head: usize,
    /// `None`: a connection may live as long as it moves requests (the boot
    /// endpoint streams images at the client's pace).
    pub connection_limit: Option<Duration>,
}

/// A reply's body: whole, or streamed (a boot artifact read from the
/// store in chunks); a streamed body that fails mid-way ends the
/// connection.
pub type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

pub type Reply = hyper::Response<Body>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    use http_body_util::BodyExt;
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}
pub type Handler = Arc<
    dyn Fn(SocketAddr, Request<Incoming>) -> Pin<Box<dyn Future<Output = Reply> + Send>>
        + Send
        + Sync,
>;

/// The client certificate a browser offered on the console's HTTPS
/// listener (already verified by its TLS), in each request's extensions.
#[derive(Debug, Clone)]
pub struct ClientCert(pub Vec<u8>);

/// Serves `handler` on `listener` within `limits` until the task is
/// dropped; `what` names the listener in logs.
pub async fn serve(listener: TcpListener, what: &'static str, limits: Limits, handler: Handler) {
    serve_with(listener, what, limits, None, handler).await
}

/// As [`serve`], over TLS with `tls`: the handshake is due within the
/// head timeout, and a client certificate offered reaches the handler as a
/// [`ClientCert`].
pub async fn serve_tls(
    listener: TcpListener,
    what: &'static str,
    limits: Limits,
    tls: Arc<rustls::ServerConfig>,
    handler: Handler,
) {
    serve_with(listener, what, limits, Some(tls), handler).await
}

async fn serve_with(
    listener: TcpListener,
    what: &'static str,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    handler: Handler,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let addresses = Arc::new(std::sync::Mutex::new(bcd_proto::tls::PerAddress::new(
        limits.max_per_address,
    )));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "{what}: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(from) = bcd_proto::tls::AddressSlot::take(&addresses, peer.ip()) else {
            debug!(%peer, "{what}: its address is at its connection limit; closed");
            drop(stream);
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "{what}: at its connection limit; closed");
            drop(stream);
            continue;
        };
        let handler = handler.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let ended = match acceptor {
                None => connection(stream, peer, None, limits, handler).await,
                Some(acceptor) => {
                    match tokio::time::timeout(limits.head_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let cert = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| ClientCert(c.to_vec()));
                            connection(stream, peer, cert, limits, handler).await
                        }
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "{what}: TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            debug!(%peer, "{what}: TLS handshake timed out");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = ended {
                debug!(%peer, error = %e, "{what}: connection ended");
            }
            drop(slot);
            drop(from);
        });
    }
}

/// One connection's requests, within `limits`.
async fn connection<S>(
    stream: S,
    peer: SocketAddr,
    cert: Option<ClientCert>,
    limits: Limits,
    handler: Handler,
) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(cert) = &cert {
            req.extensions_mut().insert(cert.clone());
        }
        let reply = handler(peer, req);
        async move { Ok::<_, Infallible>(reply.await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(limits.max_head)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    match limits.connection_limit {
        Some(limit) => match tokio::time::timeout(limit, conn).await {
            Ok(r) => r,
            Err(_) => {
                debug!(%peer, "connection closed at its time limit");
                Ok(())
            }
        },
        None => conn.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Handler = Arc::new(|_, _| {
            Box::pin(async { hyper::Response::new(full(Bytes::from_static(b"ok\n"))) })
        });
        tokio::spawn(serve(listener, "test", limits, handler));
        addr
    }

    async fn answered(addr: SocketAddr) -> bool {
        answered_from(addr, "127.0.0.1").await
    }

    /// Stalled heads hold every slot: a surplus client is closed at once,
    /// the stalled ones after the head timeout, and slots come back; a
    /// kept-alive connection idle past the head timeout is closed too.
    #[tokio::test]
    async fn stalled_and_surplus_clients_cannot_pin_it() {
        let limits = Limits {
            max_connections: 4,
            max_per_address: 4,
            head_timeout: Duration::from_millis(300),
            max_head: 8192,
            connection_limit: None,
        };
        let addr = start(limits).await;
        let mut stalled = Vec::new();
        for _ in 0..limits.max_connections {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
            stalled.push(s);
        }
        // Give the accept loop the stalled ones first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!answered(addr).await, "over the limit: closed unanswered");
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stalled[0].read_to_end(&mut out))
            .await
            .expect("a stalled head is cut off");
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(stalled);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !answered(addr).await {
            assert!(
                std::time::Instant::now() < deadline,
                "slots never came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Kept alive and then idle: the next head is due within the timeout.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("an idle kept-alive connection is closed");
        assert!(n.is_ok() && out.starts_with(b"HTTP/1.1 200 OK"), "{out:?}");
    }

    /// A connection from `local` (another loopback address), answered?
    async fn answered_from(addr: SocketAddr, local: &str) -> bool {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{local}:0").parse().unwrap()).unwrap();
        let Ok(mut s) = socket.connect(addr).await else {
            return false;
        };
        if s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .is_err()
        {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out.starts_with("HTTP/1.1 200 OK")
    }

    /// Stalled heads from one address fill only that address's share: its
    /// next connection is closed unanswered, another address is answered
    /// at once.
    #[tokio::test]
    async fn a_flood_from_one_address_leaves_room_for_the_others() {
        let limits = Limits {
            max_connections: 16,
            max_per_address: 4,
            head_timeout: Duration::from_secs(30),
            max_head: 8192,
            connection_limit: None,
        };
        let addr = start(limits).await;
        let mut stalled = Vec::new();
        for _ in 0..10 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let mut s = socket.connect(addr).await.unwrap();
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await;
            stalled.push(s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !answered_from(addr, "127.0.0.1").await,
            "the flooder got in"
        );
        let start = std::time::Instant::now();
        assert!(
            answered_from(addr, "127.0.0.2").await,
            "another address shut out"
        );
        assert!(start.elapsed() < Duration::from_secs(1));
        drop(stalled);
    }

    /// With a connection limit, even a busy connection ends at it.
    #[tokio::test]
    async fn a_connection_limit_ends_every_connection() {
        let addr = start(Limits {
            max_connections: 4,
            max_per_address: 4,
            head_timeout: Duration::from_secs(10),
            max_head: 8192,
            connection_limit: Some(Duration::from_millis(300)),
        })
        .await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("closed at the connection limit");
    }
}
