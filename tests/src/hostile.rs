//! A compromised gateway: it holds the fleet's serving certificate and key
//! (a gateway has them) and speaks the session protocol to a real `bcd`,
//! sending whatever a test scripts instead of what the store says.
//!
//! It runs on its own runtime thread in the test process, listening where
//! the honest server listened (the node dials the address in its identity).
//! Each stream a node opens becomes a [`HostileSession`] once its Hello
//! arrives: the test reads what the node sends and writes server messages,
//! or ends the stream with any status.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bcd_proto::v1::gateway_server::{Gateway, GatewayServer};
use bcd_proto::v1::{self, NodeMessage, ServerMessage, node_message, server_message};
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// A running hostile gateway; stops when dropped.
#[derive(Debug)]
pub struct Hostile {
    pub addr: SocketAddr,
    sessions: std_mpsc::Receiver<HostileSession>,
    tunnels: std_mpsc::Receiver<HostileTunnel>,
    secrets: std_mpsc::Receiver<HostileSecret>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// One stream a node opened, after its Hello.
#[derive(Debug)]
pub struct HostileSession {
    pub hello: v1::Hello,
    from_node: std_mpsc::Receiver<NodeMessage>,
    to_node: mpsc::UnboundedSender<Result<ServerMessage, Status>>,
}

type Out = mpsc::UnboundedSender<Result<ServerMessage, Status>>;

/// A `Tunnel` stream a node opened: its first frame, what it sends after,
/// and the way to it.
#[derive(Debug)]
pub struct HostileTunnel {
    pub first: v1::TunnelFrame,
    from_node: std_mpsc::Receiver<v1::TunnelFrame>,
    to_node: mpsc::UnboundedSender<Result<v1::TunnelFrame, Status>>,
}

impl HostileTunnel {
    /// Sends the node a frame of the gateway's own.
    pub fn send(&self, data: Vec<u8>) {
        let _ = self.to_node.send(Ok(v1::TunnelFrame {
            sid: String::new(),
            data,
        }));
    }

    /// Whether the node ended the stream within `timeout`.
    pub fn closed_within(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.from_node.recv_timeout(Duration::from_millis(50)) {
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return true,
                _ => continue,
            }
        }
        false
    }
}

/// A secret request a node sent (`Join.FetchSecret`), and the way to
/// answer it.
#[derive(Debug)]
pub struct HostileSecret {
    pub request: v1::SecretRequest,
    reply: tokio::sync::oneshot::Sender<Result<v1::SecretDelivery, Status>>,
}

impl HostileSecret {
    /// Answers the node with a delivery of the gateway's making.
    pub fn answer(self, jws: String) {
        let _ = self.reply.send(Ok(v1::SecretDelivery { jws }));
    }

    pub fn fail(self, status: Status) {
        let _ = self.reply.send(Err(status));
    }
}

#[derive(Clone)]
struct Service {
    sessions: std_mpsc::Sender<HostileSession>,
    tunnels: std_mpsc::Sender<HostileTunnel>,
    secrets: std_mpsc::Sender<HostileSecret>,
}

/// Only secret requests reach the test; the rest of the join service is
/// not the hostile gateway's to play.
#[tonic::async_trait]
impl v1::join_server::Join for Service {
    async fn fetch_secret(
        &self,
        request: Request<v1::SecretRequest>,
    ) -> Result<Response<v1::SecretDelivery>, Status> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.secrets
            .send(HostileSecret {
                request: request.into_inner(),
                reply,
            })
            .map_err(|_| Status::unavailable("the test stopped listening"))?;
        answer
            .await
            .map_err(|_| Status::unavailable("the test did not answer"))?
            .map(Response::new)
    }

    async fn join(
        &self,
        _: Request<v1::JoinRequest>,
    ) -> Result<Response<v1::JoinResponse>, Status> {
        Err(Status::unimplemented("not played"))
    }

    async fn begin_attestation(
        &self,
        _: Request<v1::AttestationRequest>,
    ) -> Result<Response<v1::AttestationChallenge>, Status> {
        Err(Status::unimplemented("not played"))
    }

    async fn renew(
        &self,
        _: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        Err(Status::unimplemented("not played"))
    }

    async fn fetch_release(
        &self,
        _: Request<v1::FetchReleaseRequest>,
    ) -> Result<Response<v1::FetchReleaseResponse>, Status> {
        Err(Status::unimplemented("not played"))
    }

    type FetchReleaseChunksStream =
        tokio_stream::wrappers::ReceiverStream<Result<v1::ReleaseChunk, Status>>;

    async fn fetch_release_chunks(
        &self,
        _: Request<v1::FetchReleaseRequest>,
    ) -> Result<Response<Self::FetchReleaseChunksStream>, Status> {
        Err(Status::unimplemented("not played"))
    }

    type FetchImageStream = tokio_stream::wrappers::ReceiverStream<Result<v1::ImageChunk, Status>>;

    async fn fetch_image(
        &self,
        _: Request<v1::FetchImageRequest>,
    ) -> Result<Response<Self::FetchImageStream>, Status> {
        Err(Status::unimplemented("not played"))
    }
}

type TunnelStream = Pin<Box<dyn Stream<Item = Result<v1::TunnelFrame, Status>> + Send>>;

type SessionStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Gateway for Service {
    type SessionStream = SessionStream;
    type TunnelStream = TunnelStream;

    async fn tunnel(
        &self,
        request: Request<Streaming<v1::TunnelFrame>>,
    ) -> Result<Response<TunnelStream>, Status> {
        let mut inbound = request.into_inner();
        let Ok(Some(first)) = inbound.message().await else {
            return Err(Status::invalid_argument("no first frame"));
        };
        let (to_node, rx) = mpsc::unbounded_channel();
        let (tx, from_node) = std_mpsc::channel();
        let _ = self.tunnels.send(HostileTunnel {
            first,
            from_node,
            to_node,
        });
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if tx.send(m).is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }

    async fn session(
        &self,
        request: Request<Streaming<NodeMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let (to_node, rx): (Out, _) = mpsc::unbounded_channel();
        let sessions = self.sessions.clone();
        let out = to_node.clone();
        // The node sends its Hello only once the stream is open, so the
        // response goes back first and the Hello is read here.
        tokio::spawn(async move {
            let hello = match inbound.message().await {
                Ok(Some(NodeMessage {
                    msg: Some(node_message::Msg::Hello(h)),
                })) => h,
                _ => return,
            };
            let (tx, from_node) = std_mpsc::channel();
            let session = HostileSession {
                hello,
                from_node,
                to_node: out,
            };
            if sessions.send(session).is_err() {
                return;
            }
            while let Ok(Some(m)) = inbound.message().await {
                if tx.send(m).is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
        )))
    }
}

impl Hostile {
    /// Listens on `addr` with the serving certificate and key in the
    /// server's data directory `server_dir` (not the CA key).
    pub fn start(server_dir: &Path, addr: SocketAddr) -> anyhow::Result<Hostile> {
        let leaf =
            CertificateDer::from_pem_file(server_dir.join("gateway.crt")).context("gateway.crt")?;
        let ca = CertificateDer::from_pem_file(server_dir.join("ca.crt")).context("ca.crt")?;
        let key =
            PrivateKeyDer::from_pem_file(server_dir.join("gateway.key")).context("gateway.key")?;
        Hostile::serving(vec![leaf, ca.clone()], key, ca, addr)
    }

    /// Listens on `addr` (port 0: any) with a serving `chain` and `key` a
    /// gateway was certified with, trusting node certificates of `ca`.
    pub fn serving(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: CertificateDer<'static>,
        addr: SocketAddr,
    ) -> anyhow::Result<Hostile> {
        let config = bcd_proto::tls::server_config(chain, key, ca)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // The honest server's port may linger briefly after it stopped.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match rt.block_on(tokio::net::TcpListener::bind(addr)) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e).with_context(|| format!("cannot listen on {addr}")),
            }
        };
        let addr = listener.local_addr()?;
        let (sessions_tx, sessions) = std_mpsc::channel();
        let (tunnels_tx, tunnels) = std_mpsc::channel();
        let (secrets_tx, secrets) = std_mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let incoming = bcd_proto::tls::incoming(
                    listener,
                    config,
                    std::sync::Arc::new(bcd_proto::tls::AdmitAll),
                    bcd_proto::tls::ConnectionCaps {
                        total: 1_000,
                        per_address: 1_000,
                        balancers: Vec::new(),
                    },
                );
                let service = Service {
                    sessions: sessions_tx,
                    tunnels: tunnels_tx,
                    secrets: secrets_tx,
                };
                let _ = tonic::transport::Server::builder()
                    .add_service(GatewayServer::new(service.clone()))
                    .add_service(v1::join_server::JoinServer::new(service))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
            // Streams still open end with the runtime.
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        Ok(Hostile {
            addr,
            sessions,
            tunnels,
            secrets,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The next stream a node opens (after its Hello), within `timeout`.
    pub fn next_session(&self, timeout: Duration) -> HostileSession {
        self.sessions
            .recv_timeout(timeout)
            .unwrap_or_else(|_| panic!("no node opened a session within {timeout:?}"))
    }

    /// The next tunnel a node opens, within `timeout`.
    pub fn next_tunnel(&self, timeout: Duration) -> Option<HostileTunnel> {
        self.tunnels.recv_timeout(timeout).ok()
    }

    /// The next secret request a node sends, within `timeout`.
    pub fn next_secret(&self, timeout: Duration) -> Option<HostileSecret> {
        self.secrets.recv_timeout(timeout).ok()
    }

    /// A stream opened within `timeout`, if any.
    pub fn try_next_session(&self, timeout: Duration) -> Option<HostileSession> {
        self.sessions.recv_timeout(timeout).ok()
    }

    /// Stops listening and ends every stream.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop();
    }
}

impl HostileSession {
    pub fn send(&self, msg: server_message::Msg) {
        let _ = self.to_node.send(Ok(ServerMessage { msg: Some(msg) }));
    }

    /// Ends the stream with `status`.
    pub fn end(&self, status: Status) {
        let _ = self.to_node.send(Err(status));
    }

    /// The next message the node sends within `timeout`; `None` when the
    /// node closed the stream or sent nothing.
    pub fn recv(&self, timeout: Duration) -> Option<NodeMessage> {
        self.from_node.recv_timeout(timeout).ok()
    }

    /// Reads what the node sends until `f` picks something, within
    /// `timeout`; what `f` passes over is dropped.
    pub fn recv_until<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&node_message::Msg) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_node.recv_timeout(left) {
                Ok(NodeMessage { msg: Some(m) }) => {
                    if let Some(t) = f(&m) {
                        return t;
                    }
                }
                Ok(NodeMessage { msg: None }) => {}
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the node did not send {what} within {timeout:?}")
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the node closed the stream before sending {what}")
                }
            }
        }
    }

    /// Waits until the node closes the stream, reading what it sends
    /// meanwhile; false if it is still open after `timeout`.
    pub fn closed_within(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.from_node.recv_timeout(left) {
                Ok(_) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return true,
                Err(std_mpsc::RecvTimeoutError::Timeout) => return false,
            }
        }
    }

    /// A Welcome as a gateway sends it: `epoch`, `server_time_ms`, and the
    /// inventory sections `wanted`; heartbeats every 30 s, so a session the
    /// test scripts is not closed for want of acknowledgements.
    pub fn welcome(&self, epoch: u64, server_time_ms: i64, wanted: &[&str]) {
        self.send(server_message::Msg::Welcome(v1::Welcome {
            epoch,
            server_time_ms,
            gateway_id: "gw-hostile".into(),
            heartbeat_interval_ms: 30_000,
            inventory_wanted: wanted
                .iter()
                .map(|s| {
                    let s = bcd_core::report::InventorySection::from_name(s)
                        .unwrap_or_else(|| panic!("no inventory section {s}"));
                    v1::InventoryKind::from(s) as i32
                })
                .collect(),
            first_retry_ms: 0,
            hello_seq_seen: 0,
        }));
    }
}

/// Decodes the fact inside a node-signed message.
pub fn fact<T: Message + Default>(s: &v1::NodeSigned) -> T {
    T::decode(s.payload.as_slice()).expect("a node-signed fact decodes")
}
