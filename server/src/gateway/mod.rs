//! The gateway: one bidirectional stream per node.
//!
//! A stream starts with the node's Hello. The Hello transaction (in the
//! store) checks the node's certificate and this gateway's lease, bumps the
//! session epoch and routes the node here; the gateway answers Welcome with
//! the store's time. Then the node sends a heartbeat every interval.
//! Liveness is flushed to the store as ages ("seen N ms ago"), never as
//! timestamps of this process.
//!
//! - [`session`]: one stream, from Hello to its end.
//! - [`lifetime`]: when a session ends and what it writes, decided without
//!   I/O.
//! - [`lease`]: the `gateway:<id>` lease and fencing.
//! - [`feeds`]: the loops over all sessions: liveness flush, revocations,
//!   work waiting in the store.
//! - [`ends`]: sessions that ended, written to the store together.
//! - [`admission`]: the handshake bucket; this module holds the Hello
//!   permits.
//! - [`facts`]: the node's signed facts (results, state reports,
//!   inventory), decoded for the store to judge.
//! - [`port`]: what the gateway needs from the process holding the keys
//!   (join, renewal) and the node-facing join service built on it.
//! - [`releases`]: releases handed to nodes from the store, streamed.
//! - [`credential`]: a gateway that holds no key: its credential and the
//!   serving certificate it gets for a key made in memory.
//!
//! Nothing here reaches a private key of the control plane: the gateway
//! relays signed bytes from the store and forwards joins and renewals.

pub mod admission;
pub mod credential;
pub mod ends;
pub mod facts;
pub mod feeds;
pub mod images;
pub mod lease;
pub mod lifetime;
pub mod port;
pub mod releases;
pub mod session;
pub mod tunnels;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_store::sessions::SessionKey;
use bc_store::{GatewayId, GatewayStore, NodeId};
use bcd_proto::tls::PeerInfo;
use bcd_proto::v1::{self, NodeMessage, ServerMessage, gateway_server::Gateway};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::api::status::{Turned, turned};
use lifetime::End;

/// Timings of the gateway and the liveness controller.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub heartbeat: Duration,
    pub missed_heartbeats: u32,
    pub welcome_timeout: Duration,
    pub gateway_lease_ttl: Duration,
    pub node_lease_ttl: Duration,
    pub gateway_loss_grace: Duration,
    pub sweep_every: Duration,
    pub outage_gap: Duration,
    pub outage_hold: Duration,
    pub max_pending_hellos: usize,
    /// TLS handshakes admitted per second.
    pub handshake_rate: u32,
    /// Of those, from one source address.
    pub handshake_rate_per_address: u32,
    /// On shutdown, nodes reconnect at random within this.
    pub drain_within: Duration,
    /// The controllers' table leases (renewed every third of it).
    pub controller_lease_ttl: Duration,
    /// Hello transactions a second one gateway takes (with the handshake
    /// rate, what sizes the nodes' first redial window).
    pub hello_capacity: u32,
    /// Connections open at once (TLS handshakes included).
    pub max_connections: usize,
    /// Of those, from one source address.
    pub max_connections_per_address: usize,
}

/// Hello transactions one gateway runs at once (`serve --max-pending-hellos`).
pub const DEFAULT_MAX_PENDING_HELLOS: usize = 64;

/// Connections one source address may hold open on the gateway listener:
/// a node holds one, a NAT in front of many nodes a few hundred.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_secs(10),
            missed_heartbeats: 3,
            welcome_timeout: Duration::from_secs(30),
            gateway_lease_ttl: Duration::from_secs(20),
            node_lease_ttl: Duration::from_secs(40),
            gateway_loss_grace: Duration::from_secs(120),
            sweep_every: Duration::from_secs(1),
            outage_gap: Duration::from_secs(20),
            outage_hold: Duration::from_secs(300),
            max_pending_hellos: DEFAULT_MAX_PENDING_HELLOS,
            handshake_rate: 200,
            handshake_rate_per_address: admission::DEFAULT_HANDSHAKE_RATE_PER_ADDRESS,
            drain_within: Duration::from_secs(60),
            controller_lease_ttl: crate::controllers::lease::DEFAULT_TTL,
            hello_capacity: 2_000,
            max_connections: 20_000,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
        }
    }
}

/// The store's clock as this process sees it: anchored to `compute_now()`
/// at every lease renewal, advanced by the monotonic clock in between.
#[derive(Debug)]
pub struct StoreClock {
    anchor: Mutex<(Instant, i64)>,
}

impl StoreClock {
    pub fn new(store_now_ms: i64) -> StoreClock {
        StoreClock {
            anchor: Mutex::new((Instant::now(), store_now_ms)),
        }
    }

    pub fn anchor(&self, store_now_ms: i64) {
        *self.anchor.lock().unwrap_or_else(|p| p.into_inner()) = (Instant::now(), store_now_ms);
    }

    pub fn now_ms(&self) -> i64 {
        let (at, ms) = *self.anchor.lock().unwrap_or_else(|p| p.into_inner());
        ms + at.elapsed().as_millis() as i64
    }
}

/// A session this gateway holds.
struct LocalSession {
    epoch: u64,
    cert_serial: String,
    cert_not_after_ms: i64,
    last_heard: Arc<Mutex<Instant>>,
    /// Ends the session: it tells the node and writes what [`End`] says.
    end: Option<oneshot::Sender<End>>,
    /// Wakes the session's dispatcher when work waits for it.
    wake: Arc<Notify>,
    /// The spec generation the session sent the node (or the node said it
    /// had at its Hello).
    sent_generation: Arc<std::sync::atomic::AtomicU64>,
    /// Tunnels asked of the node; closed with the session.
    tunnels: tunnels::SessionTunnels,
}

/// One gateway's state, shared by its streams and its background loops.
pub struct GatewayState {
    pub id: GatewayId,
    pub store: GatewayStore,
    pub timing: Timing,
    pub clock: StoreClock,
    sessions: Mutex<HashMap<NodeId, LocalSession>>,
    hellos: Arc<Semaphore>,
    /// How far this process's wall clock ([`crate::clock`]) was from the
    /// store's at the last renewal.
    pub clock_offset_ms: AtomicI64,
    /// The first-redial window Welcomes carry (see
    /// [`admission::first_retry_window`]), refreshed by the work feed.
    pub first_retry_ms: AtomicU32,
    /// Hellos committed a second, measured: what this gateway reports it
    /// absorbs ([`admission::Absorption`]).
    absorption: Mutex<(std::time::Instant, admission::Absorption)>,
    fenced: AtomicBool,
    /// An operator drains this gateway (`gateways drain`): new sessions
    /// are refused until `gateways undrain` or a restart.
    draining: AtomicBool,
    /// Sessions that ended, waiting to be written together.
    pub ends: ends::Ends,
    /// What the gateway counts for `/metrics`.
    pub metrics: Arc<crate::metrics::ServerMetrics>,
    /// Shutting down: stays fenced whatever the lease does.
    stopping: AtomicBool,
    /// Held by a lease renewal while it runs; a shutdown takes it before
    /// releasing the lease, so no renewal in flight takes it back.
    renewing: tokio::sync::Mutex<()>,
    /// The newest signed gateway revocation list read from the store
    /// ([`feeds::revocations`]): every session hands it to its node at the
    /// Welcome and whenever a newer one arrives.
    pub gateway_revocations: tokio::sync::watch::Sender<Option<Arc<Vec<u8>>>>,
    /// When the list held was signed.
    gateway_revocations_issued: AtomicI64,
    /// Tunnels asked of nodes and not opened yet, by sid.
    tunnels: Mutex<HashMap<String, tunnels::Pending>>,
}

impl std::fmt::Debug for GatewayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayState")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl GatewayState {
    pub fn new(
        id: GatewayId,
        store: GatewayStore,
        timing: Timing,
        store_now_ms: i64,
        metrics: Arc<crate::metrics::ServerMetrics>,
    ) -> Arc<GatewayState> {
        metrics.set_gateway(&id);
        metrics.fenced.set(1);
        Arc::new(GatewayState {
            id,
            store,
            timing,
            clock: StoreClock::new(store_now_ms),
            sessions: Mutex::new(HashMap::new()),
            hellos: Arc::new(Semaphore::new(timing.max_pending_hellos)),
            clock_offset_ms: AtomicI64::new(0),
            first_retry_ms: AtomicU32::new(1_000),
            absorption: Mutex::new((crate::clock::mono(), admission::Absorption::default())),
            fenced: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            ends: ends::Ends::default(),
            metrics,
            stopping: AtomicBool::new(false),
            renewing: tokio::sync::Mutex::new(()),
            gateway_revocations: tokio::sync::watch::Sender::new(None),
            gateway_revocations_issued: AtomicI64::new(i64::MIN),
            tunnels: Mutex::new(HashMap::new()),
        })
    }

    /// A signed gateway revocation list read from the store: held and
    /// handed to every session if it is newer than the one held.
    pub fn offer_gateway_revocations(&self, list: bc_store::gateways::SignedRevocations) {
        if self
            .gateway_revocations_issued
            .fetch_max(list.issued_ms, Ordering::SeqCst)
            < list.issued_ms
        {
            self.gateway_revocations
                .send_replace(Some(Arc::new(list.envelope)));
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, LocalSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions held now, for `/metrics`.
    fn count_sessions(&self, sessions: &HashMap<NodeId, LocalSession>) {
        self.metrics.sessions.set(sessions.len() as i64);
    }

    pub fn lease_name(&self) -> String {
        bc_store::leases::gateway_lease(&self.id)
    }

    /// Ends one session, if it is still the one under `epoch` (any epoch
    /// when `None`).
    fn end_session(&self, node: &str, epoch: Option<u64>, end: End) {
        let mut sessions = self.sessions();
        if let Some(s) = sessions.get_mut(node)
            && epoch.is_none_or(|e| e == s.epoch)
            && let Some(tx) = s.end.take()
        {
            let _ = tx.send(end);
        }
    }

    /// Fences the gateway: forget the lease, close every stream.
    /// A Hello committed now.
    pub fn hello_committed(&self) {
        let mut a = self.absorption.lock().unwrap_or_else(|p| p.into_inner());
        let second = a.0.elapsed().as_secs();
        a.1.committed(second);
    }

    /// What this gateway absorbs a second: its measured peak, floored at
    /// what its handshake bucket and Hello capacity admit.
    pub fn absorbs_per_s(&self) -> u32 {
        let a = self.absorption.lock().unwrap_or_else(|p| p.into_inner());
        a.1.reported(a.0.elapsed().as_secs(), self.absorption_floor())
    }

    /// The handshakes this gateway admits at once from known nodes
    /// ([`admission::known_burst`]).
    pub fn known_burst(&self) -> u32 {
        admission::known_burst(self.timing.handshake_rate, self.timing.hello_capacity)
    }

    /// The rate this gateway admits by configuration alone.
    pub fn absorption_floor(&self) -> u32 {
        self.timing.hello_capacity.min(self.timing.handshake_rate)
    }

    pub fn fence(&self, why: &str) {
        self.metrics.fenced.set(1);
        if !self.fenced.swap(true, Ordering::SeqCst) {
            warn!(gateway = %self.id, reason = why, "fencing: closing every session");
        }
        let mut sessions = self.sessions();
        for s in sessions.values_mut() {
            if let Some(tx) = s.end.take() {
                let _ = tx.send(End::Fenced {
                    gateway: self.id.to_string(),
                });
            }
        }
    }

    /// Work for `node` waits in the store: its session looks now rather
    /// than at the next poll.
    pub fn wake(&self, node: &str) {
        if let Some(s) = self.sessions().get(node) {
            s.wake.notify_one();
        }
    }

    /// Wakes every session whose node the store has at a newer spec
    /// generation than the session sent; how many.
    pub fn wake_behind(&self, store: &[(NodeId, u64)]) -> usize {
        let sessions = self.sessions();
        let behind = feeds::behind(
            |node| {
                sessions
                    .get(node)
                    .map(|s| s.sent_generation.load(Ordering::SeqCst))
            },
            store,
        );
        for node in &behind {
            if let Some(s) = sessions.get(*node) {
                s.wake.notify_one();
            }
        }
        behind.len()
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The spec's drain on an operator's word, without stopping: every
    /// session is told to reconnect at random within `within` (the
    /// gateway's --drain-within when none), and new sessions are refused
    /// until [`undrain`](Self::undrain). Returns the sessions told.
    pub fn drain(&self, within: Option<Duration>) -> usize {
        self.draining.store(true, Ordering::SeqCst);
        let within = within.unwrap_or(self.timing.drain_within);
        let told = self
            .sessions()
            .values_mut()
            .filter_map(|s| s.end.take())
            .map(|tx| tx.send(End::Drain { within }).is_ok() as usize)
            .sum();
        info!(sessions = told, ?within, "draining on an operator's word");
        told
    }

    /// Takes sessions again after a [`drain`](Self::drain).
    pub fn undrain(&self) {
        if self.draining.swap(false, Ordering::SeqCst) {
            info!("taking sessions again");
        }
    }

    /// A planned stop: no new sessions, every node drained (told to
    /// reconnect at random within the drain window, so a fleet does not
    /// land on the other gateways at once), then the remaining sessions
    /// disconnected and the lease released together. A crash does neither.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.fenced.store(true, Ordering::SeqCst);
        let within = self.timing.drain_within;
        let draining: usize = {
            let mut sessions = self.sessions();
            sessions
                .values_mut()
                .filter_map(|s| s.end.take())
                .map(|tx| tx.send(End::Drain { within }).is_ok() as usize)
                .sum()
        };
        if draining > 0 {
            info!(sessions = draining, ?within, "draining");
            let deadline = Instant::now() + Duration::from_secs(2);
            while !self.sessions().is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.fence("shutting down");
        // The drained sessions' ends first, while the lease is still held.
        ends::write(self).await;
        let _no_renewal = self.renewing.lock().await;
        let mine: Vec<SessionKey> = self
            .sessions()
            .iter()
            .map(|(n, s)| SessionKey {
                node_id: n.clone(),
                epoch: s.epoch,
            })
            .collect();
        if let Err(e) = self
            .metrics
            .timed(
                "gateway_shutdown",
                self.store.gateway_shutdown(&self.id, &mine),
            )
            .await
        {
            warn!(error = %e, "cannot record the gateway's shutdown");
        }
    }
}

impl crate::api::Wake for GatewayState {
    fn wake(&self, node: &str) {
        GatewayState::wake(self, node);
    }

    fn id(&self) -> &str {
        &self.id
    }

    fn drain(&self, within: Option<Duration>) -> usize {
        GatewayState::drain(self, within)
    }

    fn undrain(&self) {
        GatewayState::undrain(self)
    }
}

/// The tonic service.
#[derive(Debug, Clone)]
pub struct GatewayService {
    pub state: Arc<GatewayState>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Gateway for GatewayService {
    type SessionStream = SessionStream;
    type TunnelStream = tunnels::TunnelStream;

    async fn tunnel(
        &self,
        request: Request<Streaming<v1::TunnelFrame>>,
    ) -> Result<Response<Self::TunnelStream>, Status> {
        tunnels::accept(&self.state, request).await
    }

    async fn session(
        &self,
        request: Request<Streaming<NodeMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| Some((p.cert_fingerprint.clone()?, p.cert.clone()?)))
            .ok_or_else(|| {
                turned(Turned::NoCertificate(
                    "a node certificate is required: join first: bcd join --server URL --token TOKEN",
                ))
            })?;
        if self.state.is_fenced() {
            self.state.metrics.hello_refused("fenced");
            return Err(turned(Turned::GatewayFenced(self.state.id.to_string())));
        }
        if self.state.is_draining() {
            self.state.metrics.hello_refused("draining");
            return Err(turned(Turned::GatewayDraining(self.state.id.to_string())));
        }
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(32);
        let state = self.state.clone();
        tokio::spawn(async move {
            session::run(state, peer, inbound, tx).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
