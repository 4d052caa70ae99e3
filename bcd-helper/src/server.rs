//! The helper's socket server.
//!
//! [`Server::bind`] makes the socket (mode 0660 by default, its group set
//! to the daemon user's, so only root and that group can even connect) and
//! [`Server::serve`] accepts connections. Each connection is checked before
//! anything else: its peer credentials (`SO_PEERCRED`, which the kernel
//! records at connect time) must name the configured uid (root only when
//! [`ServerConfig::allow_root`] says so), the connection count must be
//! under the cap, and the client's Hello must carry this
//! [`PROTOCOL_VERSION`]. A refusal is one HelloReply naming the reason,
//! then the connection closes. After the handshake the server reads one
//! request at a time, decodes and validates it ([`crate::request::decode`],
//! plus the sysfs check of a GPU reset), calls the [`Handler`] under the
//! request timeout, and writes its reply. A frame that is not a request
//! gets an `invalid` failure and the connection goes on; a frame over the
//! size limit gets one and the connection closes (there is no way to skip
//! it). Nothing a client sends ends the server.
//!
//! Logging: `error` when the server itself cannot go on, `warn` for
//! refusals and failed requests (rate-limited: a peer can trigger them),
//! `info` for each act a handler carried out, `debug` for connections.
//! Every request runs in a `helper_request` span with its kind and the
//! peer's pid.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info, warn};

use crate::error::HelperError;
use crate::frame::{self, FrameError};
use crate::request::{self, Reply, Request};
use crate::{PROTOCOL_VERSION, validate, wire};

/// How the helper listens and whom it serves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The socket's path (`/run/bcd/helper.sock`). Its directory must
    /// exist.
    pub socket: PathBuf,
    /// The uid of the one user served: the user `bcd node` runs as.
    pub uid: u32,
    /// Serve root too (for `bcd doctor` run as root, say).
    pub allow_root: bool,
    /// The socket's group (the daemon user's group); `None` leaves it.
    pub socket_gid: Option<u32>,
    /// The socket's mode.
    pub socket_mode: u32,
    /// Connections served at once; more are refused at the handshake.
    pub max_connections: usize,
    /// The client's Hello must arrive within this.
    pub handshake_timeout: Duration,
    /// Once a frame started, its rest must arrive within this.
    pub frame_timeout: Duration,
    /// A handler must answer within this; the request fails otherwise.
    pub request_timeout: Duration,
    /// A connection with no request for this long is closed (the client
    /// reconnects at its next request). `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Where GPU resets are checked (`/sys`).
    pub sysfs_root: PathBuf,
    /// This build, for the handshake: `bcd-helper 0.1.0`.
    pub software: String,
}

impl ServerConfig {
    /// The defaults for serving `uid` on `socket`.
    pub fn new(socket: impl Into<PathBuf>, uid: u32) -> ServerConfig {
        ServerConfig {
            socket: socket.into(),
            uid,
            allow_root: false,
            socket_gid: None,
            socket_mode: 0o660,
            max_connections: 8,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            idle_timeout: Some(Duration::from_secs(900)),
            sysfs_root: PathBuf::from("/sys"),
            software: format!("bcd-helper {}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// Who is on the other end of a connection, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// What carries out the requests. The server calls it only with requests
/// that passed validation, one at a time per connection.
pub trait Handler: Send + Sync + 'static {
    /// State of one connection, made when its handshake succeeds and
    /// dropped when it closes: an open TPM device, for one, so the handles
    /// a client made stay valid for its connection and go with it.
    type Conn: Send + 'static;

    fn open(&self, peer: &Peer) -> Self::Conn;

    /// Carries out one request. The future is dropped when it runs past
    /// the request timeout, so work that must finish once started belongs
    /// in a task of its own.
    fn handle(
        &self,
        conn: &mut Self::Conn,
        request: Request,
    ) -> impl Future<Output = Result<Reply, HelperError>> + Send;
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{path} exists and is not a socket: remove it, or give the helper another socket path")]
    NotASocket { path: PathBuf },
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set the group or mode of {path}")]
    Permissions {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// At most one message per interval; counts what it held back.
#[derive(Debug)]
pub(crate) struct LogLimit {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    pub(crate) fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log now, `n` messages were held back since the last one.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

struct Shared<H> {
    config: ServerConfig,
    handler: H,
    slots: Arc<Semaphore>,
    log: Mutex<LogLimit>,
}

impl<H> Shared<H> {
    fn warn_limited(&self, message: std::fmt::Arguments<'_>) {
        let allowed = self
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow(bcd_sys::clock::mono());
        if let Some(held_back) = allowed {
            if held_back > 0 {
                warn!(held_back, "{message}");
            } else {
                warn!("{message}");
            }
        }
    }
}

/// A bound helper socket and its handler.
pub struct Server<H> {
    listener: UnixListener,
    shared: Arc<Shared<H>>,
}

impl<H> std::fmt::Debug for Server<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Server<H> {
    /// Makes the socket: a stale socket at the path is replaced, anything
    /// else there is refused. Must run inside a tokio runtime.
    pub fn bind(config: ServerConfig, handler: H) -> Result<Server<H>, ServerError> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let path = config.socket.clone();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                std::fs::remove_file(&path).map_err(|source| ServerError::Bind {
                    path: path.clone(),
                    source,
                })?;
            }
            Ok(_) => return Err(ServerError::NotASocket { path }),
            Err(_) => {}
        }
        let listener = UnixListener::bind(&path).map_err(|source| ServerError::Bind {
            path: path.clone(),
            source,
        })?;
        let perms = |source| ServerError::Permissions {
            path: path.clone(),
            source,
        };
        if let Some(gid) = config.socket_gid {
            rustix::fs::chown(&path, None, Some(rustix::fs::Gid::from_raw(gid)))
                .map_err(|e| perms(e.into()))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(config.socket_mode))
            .map_err(perms)?;
        let slots = Arc::new(Semaphore::new(config.max_connections));
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                config,
                handler,
                slots,
                log: Mutex::new(LogLimit::new(Duration::from_secs(10))),
            }),
        })
    }

    pub fn socket(&self) -> &Path {
        &self.shared.config.socket
    }

    /// Serves until the task is dropped.
    pub async fn serve(self) {
        self.serve_until(std::future::pending()).await
    }

    /// Serves until `shutdown` completes, then removes the socket.
    /// Connections in progress finish on their own tasks.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let shared = self.shared.clone();
                        tokio::spawn(connection(stream, shared));
                    }
                    Err(e) => {
                        // Out of file descriptors, most likely: let
                        // connections end before accepting more.
                        self.shared.warn_limited(format_args!("accepting a connection: {e}"));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
    }
}

fn peer_of(stream: &UnixStream) -> std::io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(stream)?;
    Ok(Peer {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
    })
}

/// Why this peer may not be served, worded for the operator.
fn refusal(config: &ServerConfig, peer: &Peer) -> Option<String> {
    if peer.uid == config.uid || (peer.uid == 0 && config.allow_root) {
        return None;
    }
    Some(format!(
        "bcd-helper serves uid {}{}, not uid {}: run bcd node as the helper's user, or configure the helper for this one",
        config.uid,
        if config.allow_root { " and root" } else { "" },
        peer.uid
    ))
}

/// The refusal of a client of another protocol version.
pub fn version_refusal(theirs: u32) -> String {
    format!(
        "bcd-helper speaks protocol version {PROTOCOL_VERSION}, this client speaks {theirs}: restart bcd and bcd-helper after replacing the binary"
    )
}

async fn send<M: prost::Message>(stream: &mut UnixStream, m: &M) -> Result<(), FrameError> {
    let f = frame::encode(m)?;
    frame::write(stream, &f).await
}

async fn connection<H: Handler>(mut stream: UnixStream, shared: Arc<Shared<H>>) {
    let config = &shared.config;
    let peer = match peer_of(&stream) {
        Ok(p) => p,
        Err(e) => {
            shared.warn_limited(format_args!("no peer credentials on a connection: {e}"));
            return;
        }
    };
    // Only a peer that may be served takes one of the connection slots, so
    // other users who can reach the socket cannot crowd the daemon out.
    let refused_peer = refusal(config, &peer);
    let permit = match refused_peer {
        None => shared.slots.clone().try_acquire_owned().ok(),
        Some(_) => None,
    };
    debug!(pid = peer.pid, uid = peer.uid, "connection");
    let hello = tokio::time::timeout(
        config.handshake_timeout,
        frame::read(&mut stream, frame::MAX_HELLO, config.frame_timeout),
    )
    .await;
    let hello = match hello {
        Err(_) => {
            debug!(pid = peer.pid, "no Hello within the handshake timeout");
            return;
        }
        Ok(Err(FrameError::Closed)) => return,
        Ok(Err(e)) => Err(format!("not a bcd-helper handshake: {e}")),
        Ok(Ok(body)) => frame::decode::<wire::Hello>("Hello", &body)
            .map_err(|e| format!("not a bcd-helper handshake: {e}")),
    };
    let refused = match (&hello, refused_peer, &permit) {
        (_, Some(r), _) => Some(r),
        (Err(e), None, _) => Some(e.clone()),
        (Ok(_), None, None) => Some(format!(
            "bcd-helper serves {} connections already: stop the other clients or raise its connection limit",
            config.max_connections
        )),
        (Ok(h), None, Some(_)) if h.version != PROTOCOL_VERSION => Some(version_refusal(h.version)),
        (Ok(_), None, Some(_)) => None,
    };
    let reply = wire::HelloReply {
        version: PROTOCOL_VERSION,
        software: config.software.clone(),
        refused: refused.clone().unwrap_or_default(),
    };
    if let Some(why) = refused {
        shared.warn_limited(format_args!(
            "refused a connection from pid {} uid {}: {why}",
            peer.pid, peer.uid
        ));
        let _ = send(&mut stream, &reply).await;
        return;
    }
    if send(&mut stream, &reply).await.is_err() {
        return;
    }
    let mut conn = shared.handler.open(&peer);
    loop {
        let next = frame::read(&mut stream, frame::MAX_FRAME, config.frame_timeout);
        let body = match config.idle_timeout {
            Some(idle) => match tokio::time::timeout(idle, next).await {
                Ok(r) => r,
                Err(_) => {
                    debug!(pid = peer.pid, "closing an idle connection");
                    return;
                }
            },
            None => next.await,
        };
        let body = match body {
            Ok(b) => b,
            Err(FrameError::Closed) => return,
            Err(e @ FrameError::TooLarge { .. }) => {
                shared.warn_limited(format_args!("pid {}: {e}", peer.pid));
                let failure = HelperError::invalid(format!("{e}: the connection closes"));
                let _ = send(&mut stream, &failure_response(&failure)).await;
                return;
            }
            Err(e) => {
                shared.warn_limited(format_args!("pid {}: {e}", peer.pid));
                return;
            }
        };
        let response = match request::decode(&body) {
            Ok(request) => {
                let kind = request.kind();
                let span =
                    tracing::info_span!("helper_request", kind = kind.name(), pid = peer.pid);
                let outcome = carry_out(&shared, &mut conn, request)
                    .instrument(span)
                    .await;
                match outcome {
                    Ok(reply) => reply.to_wire(),
                    Err(e) => {
                        shared.warn_limited(format_args!(
                            "{kind} for pid {} failed ({}): {e}",
                            peer.pid,
                            e.kind.name()
                        ));
                        failure_response(&e)
                    }
                }
            }
            Err(e) => {
                shared.warn_limited(format_args!(
                    "pid {} sent an invalid request: {e}",
                    peer.pid
                ));
                failure_response(&e.into())
            }
        };
        if send(&mut stream, &response).await.is_err() {
            return;
        }
    }
}

async fn carry_out<H: Handler>(
    shared: &Shared<H>,
    conn: &mut H::Conn,
    request: Request,
) -> Result<Reply, HelperError> {
    let config = &shared.config;
    if let Request::ResetGpu(address) = &request {
        validate::check_gpu(&config.sysfs_root, address)?;
    }
    let kind = request.kind();
    let reply = tokio::time::timeout(config.request_timeout, shared.handler.handle(conn, request))
        .await
        .map_err(|_| {
            HelperError::timeout(format!(
                "bcd-helper gave up on {kind} after {} s; it may have been carried out in part",
                config.request_timeout.as_secs()
            ))
        })??;
    if reply.shape() != kind.reply_shape() {
        tracing::error!(?reply, "the handler answered {kind} with the wrong reply");
        return Err(HelperError::failed(format!(
            "bcd-helper answered {kind} with a {:?} reply",
            reply.shape()
        )));
    }
    info!("done");
    Ok(reply)
}

fn failure_response(e: &HelperError) -> wire::Response {
    wire::Response {
        result: Some(wire::response::Result::Failure(e.to_wire())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_limit_lets_one_through_per_interval_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut l = LogLimit::new(Duration::from_secs(10));
        assert_eq!(l.allow(t0), Some(0));
        assert_eq!(l.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(9)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(l.allow(t0 + Duration::from_secs(11)), None);
        assert_eq!(l.allow(t0 + Duration::from_secs(30)), Some(1));
    }

    #[test]
    fn only_the_configured_user_and_root_when_allowed_are_served() {
        let mut c = ServerConfig::new("/x", 1000);
        let peer = |uid| Peer {
            pid: 1,
            uid,
            gid: 0,
        };
        assert_eq!(refusal(&c, &peer(1000)), None);
        let r = refusal(&c, &peer(0)).unwrap();
        assert_eq!(
            r,
            "bcd-helper serves uid 1000, not uid 0: run bcd node as the helper's user, or configure the helper for this one"
        );
        assert!(refusal(&c, &peer(1001)).is_some());
        c.allow_root = true;
        assert_eq!(refusal(&c, &peer(0)), None);
        assert!(
            refusal(&c, &peer(1001))
                .unwrap()
                .contains("serves uid 1000 and root")
        );
    }
}
