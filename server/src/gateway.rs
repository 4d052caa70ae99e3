//! The gateway: one bidirectional stream per node.
//!
//! A stream starts with the node's Hello. The Hello transaction (in the
//! store) checks the node's certificate, bumps the session epoch and routes
//! the node here; the gateway answers Welcome with the store's time. Then the
//! node sends a heartbeat every interval; three missed intervals close the
//! session with an epoch-fenced disconnect write. Liveness is flushed to the
//! store as ages ("seen N ms ago"), never as timestamps of this process.
//!
//! The gateway holds the lease `gateway:<id>`. Without a renewal for half
//! its TTL, or on finding another owner, it fences itself: it closes every
//! stream UNAVAILABLE and refuses new ones until it holds the lease again.
//! At most 64 Hello transactions run at once; more are refused
//! RESOURCE_EXHAUSTED and the node retries with back-off.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bcd_proto::tls::PeerInfo;
use bcd_proto::v1::{
    self, NodeMessage, ServerMessage, Welcome, gateway_server::Gateway, node_message,
    server_message,
};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::store::{HelloInput, Refusal, Store, TxError};

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
    /// On shutdown, nodes reconnect at random within this.
    pub drain_within: Duration,
}

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
            max_pending_hellos: 64,
            handshake_rate: 200,
            drain_within: Duration::from_secs(60),
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

struct LocalSession {
    epoch: u64,
    cert_serial: String,
    cert_not_after_ms: i64,
    /// Set when the certificate is revoked: the session ends with a notice.
    revoked: Option<oneshot::Sender<(String, String)>>,
    last_heard: Arc<Mutex<Instant>>,
    close: Option<oneshot::Sender<Status>>,
    /// Wakes the session's dispatcher when a command is created.
    wake: Arc<Notify>,
    /// Set when the gateway shuts down: the node is told to reconnect
    /// within this, at random.
    drain: Option<oneshot::Sender<Duration>>,
}

/// One gateway's state, shared by its streams and its background loops.
pub struct GatewayState {
    pub id: String,
    pub store: Store,
    /// Its own connection for the lease: renewals never wait behind Hellos.
    pub lease_store: Store,
    pub timing: Timing,
    pub clock: StoreClock,
    sessions: Mutex<HashMap<String, LocalSession>>,
    hellos: Arc<Semaphore>,
    fenced: AtomicBool,
    /// Shutting down: stays fenced whatever the lease does.
    stopping: AtomicBool,
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
        id: String,
        store: Store,
        lease_store: Store,
        timing: Timing,
        store_now_ms: i64,
    ) -> Arc<GatewayState> {
        Arc::new(GatewayState {
            id,
            store,
            lease_store,
            timing,
            clock: StoreClock::new(store_now_ms),
            sessions: Mutex::new(HashMap::new()),
            hellos: Arc::new(Semaphore::new(timing.max_pending_hellos)),
            fenced: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn lease_name(&self) -> String {
        format!("gateway:{}", self.id)
    }

    /// Closes one session with `status`, if it is still the one under `epoch`.
    fn close_session(&self, node: &str, epoch: Option<u64>, status: Status) {
        let mut sessions = self.sessions();
        if let Some(s) = sessions.get_mut(node)
            && epoch.is_none_or(|e| e == s.epoch)
            && let Some(tx) = s.close.take()
        {
            let _ = tx.send(status);
        }
    }

    /// Fences the gateway: forget the lease, close every stream.
    pub fn fence(&self, why: &str) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            warn!(gateway = %self.id, reason = why, "fencing: closing every session");
        }
        let mut sessions = self.sessions();
        for s in sessions.values_mut() {
            if let Some(tx) = s.close.take() {
                let _ = tx.send(Status::unavailable(format!(
                    "gateway {} lost its lease; reconnect",
                    self.id
                )));
            }
        }
    }

    /// Every second, one store query finds the local sessions with a
    /// pending command or a changed spec (written through any gateway) and
    /// wakes them.
    pub async fn work_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.is_fenced() || self.sessions().is_empty() {
                continue;
            }
            // Overlapping windows: a wake for a spec already sent is a no-op.
            let since = self.clock.now_ms() - 3_000;
            let gw = self.id.clone();
            match self.store.run(move |s| s.nodes_with_work(&gw, since)).await {
                Ok(nodes) => {
                    for n in nodes {
                        self.wake(&n);
                    }
                }
                Err(e) => warn!(error = %format!("{e:#}"), "cannot look for pending work"),
            }
        }
    }

    /// A command for `node` was created: dispatch now rather than at the
    /// next poll.
    pub fn wake(&self, node: &str) {
        if let Some(s) = self.sessions().get(node) {
            s.wake.notify_one();
        }
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Keeps the `gateway:<id>` lease. Renews every quarter TTL; fences after
    /// half the TTL without a renewal or when another owner holds it.
    pub async fn lease_loop(self: Arc<Self>) {
        let ttl = self.timing.gateway_lease_ttl;
        let mut last_ok: Option<Instant> = None;
        let mut tick = tokio::time::interval(ttl / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (name, owner) = (self.lease_name(), self.id.clone());
            let r = tokio::time::timeout(
                ttl / 2,
                self.lease_store
                    .run(move |s| s.renew_lease(&name, &owner, ttl)),
            )
            .await;
            match r {
                Ok(Ok(Some(now))) => {
                    self.clock.anchor(now);
                    last_ok = Some(Instant::now());
                    if !self.stopping.load(Ordering::SeqCst)
                        && self.fenced.swap(false, Ordering::SeqCst)
                    {
                        info!(gateway = %self.id, "holding the gateway lease; admitting sessions");
                    }
                }
                Ok(Ok(None)) => self.fence("another owner holds the gateway lease"),
                Ok(Err(e)) => {
                    warn!(error = %format!("{e:#}"), "gateway lease renewal failed");
                    if last_ok.is_none_or(|t| t.elapsed() >= ttl / 2) {
                        self.fence("no lease renewal for half the lease TTL");
                    }
                }
                Err(_) => {
                    warn!("gateway lease renewal timed out");
                    if last_ok.is_none_or(|t| t.elapsed() >= ttl / 2) {
                        self.fence("no lease renewal for half the lease TTL");
                    }
                }
            }
        }
    }

    /// Flushes "seen age ago" for every local session; closes sessions a
    /// newer Hello took elsewhere.
    pub async fn liveness_loop(self: Arc<Self>) {
        let every = self.timing.heartbeat.min(Duration::from_secs(5));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.is_fenced() {
                continue;
            }
            let seen: Vec<(String, u64, Duration)> = self
                .sessions()
                .iter()
                .map(|(n, s)| {
                    let heard = *s.last_heard.lock().unwrap_or_else(|p| p.into_inner());
                    (n.clone(), s.epoch, heard.elapsed())
                })
                .collect();
            // Sessions whose certificate ran out end here; the node comes
            // back with its renewed certificate.
            let now_ms = self.clock.now_ms();
            let expired: Vec<(String, u64)> = self
                .sessions()
                .iter()
                .filter(|(_, s)| s.cert_not_after_ms < now_ms)
                .map(|(n, s)| (n.clone(), s.epoch))
                .collect();
            for (node, epoch) in expired {
                info!(%node, "certificate expired; closing the session");
                self.close_session(
                    &node,
                    Some(epoch),
                    Status::unauthenticated(crate::store::Refusal::Expired.to_string()),
                );
            }
            if seen.is_empty() {
                continue;
            }
            let gw = self.id.clone();
            match self.store.run(move |s| s.flush_liveness(&gw, &seen)).await {
                Ok(gone) => {
                    for (node, epoch) in gone {
                        debug!(%node, epoch, "session superseded; closing it");
                        self.close_session(
                            &node,
                            Some(epoch),
                            Status::aborted("session superseded by a newer one"),
                        );
                    }
                }
                Err(e) => warn!(error = %format!("{e:#}"), "liveness flush failed"),
            }
        }
    }

    /// The revocation feed: every second, certificates revoked since the
    /// last look end the sessions that present them.
    pub async fn revocation_loop(self: Arc<Self>, every: Duration) {
        let mut since = self.clock.now_ms() - 1_000;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let from = since;
            match self.store.run(move |s| s.revoked_since(from)).await {
                Ok(rows) => {
                    for (serial, node, reason, at) in rows {
                        since = since.max(at);
                        let mut sessions = self.sessions();
                        if let Some(s) = sessions.get_mut(&node)
                            && s.cert_serial == serial
                            && let Some(tx) = s.revoked.take()
                        {
                            let _ = tx.send((serial, reason));
                        }
                    }
                }
                Err(e) => warn!(error = %format!("{e:#}"), "revocation feed failed"),
            }
        }
    }

    /// Marks this gateway's sessions disconnected and gives the lease back;
    /// for an orderly shutdown only (a crash does neither).
    /// A planned stop: no new sessions, every node drained, then the
    /// remaining sessions closed, their disconnects written and the lease
    /// released.
    pub async fn shutdown(&self) {
        // No new Hellos from here on.
        self.stopping.store(true, Ordering::SeqCst);
        self.fenced.store(true, Ordering::SeqCst);
        // Drain: each node is told to reconnect at random within the drain
        // window, so a fleet does not land on the other gateways at once.
        let draining: usize = {
            let mut sessions = self.sessions();
            sessions
                .values_mut()
                .filter_map(|s| s.drain.take())
                .map(|tx| tx.send(self.timing.drain_within).is_ok() as usize)
                .sum()
        };
        if draining > 0 {
            info!(sessions = draining, within = ?self.timing.drain_within, "draining");
            let deadline = Instant::now() + Duration::from_secs(2);
            while !self.sessions().is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.fence("shutting down");
        let mine: Vec<(String, u64)> = self
            .sessions()
            .iter()
            .map(|(n, s)| (n.clone(), s.epoch))
            .collect();
        let (name, owner) = (self.lease_name(), self.id.clone());
        let _ = self
            .store
            .run(move |s| {
                for (node, epoch) in mine {
                    s.disconnect(&node, epoch, Duration::ZERO, "gateway-shutdown")?;
                }
                s.release_lease(&name, &owner)
            })
            .await;
    }
}

/// How often a session looks for work by itself, besides being woken.
const SESSION_POLL: Duration = Duration::from_secs(30);

/// The tonic service.
#[derive(Debug, Clone)]
pub struct GatewayService {
    pub state: Arc<GatewayState>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

pub fn refusal_status(e: TxError) -> Status {
    match e {
        TxError::Refused(r) => match r {
            Refusal::UnknownToken | Refusal::ExpiredToken | Refusal::UsedToken => {
                Status::permission_denied(r.to_string())
            }
            Refusal::BadRequest(m) => Status::invalid_argument(m),
            Refusal::Fenced(_) => Status::unavailable(r.to_string()),
            Refusal::Internal(m) => {
                warn!(error = %m, "internal error");
                Status::internal("the server failed to handle the request; see its log")
            }
            _ => Status::unauthenticated(r.to_string()),
        },
        TxError::Store(e) => {
            warn!(error = %format!("{e:#}"), "store error");
            Status::unavailable("the server's store is unavailable; retry later")
        }
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<NodeMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        let fingerprint = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.cert_fingerprint.clone())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "a node certificate is required: join first: bcd join --server URL --token TOKEN",
                )
            })?;
        if self.state.is_fenced() {
            return Err(Status::unavailable(
                "this gateway holds no lease right now; retry",
            ));
        }
        let permit = self
            .state
            .hellos
            .clone()
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted("too many Hellos in flight; retry"))?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(32);
        let state = self.state.clone();
        tokio::spawn(async move {
            run_session(state, fingerprint, inbound, tx, permit).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

type Out = mpsc::Sender<Result<ServerMessage, Status>>;

fn msg(m: server_message::Msg) -> Result<ServerMessage, Status> {
    Ok(ServerMessage { msg: Some(m) })
}

async fn run_session(
    state: Arc<GatewayState>,
    fingerprint: String,
    mut inbound: Streaming<NodeMessage>,
    out: Out,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let timing = state.timing;
    let hello = match tokio::time::timeout(timing.welcome_timeout, inbound.message()).await {
        Ok(Ok(Some(NodeMessage {
            msg: Some(node_message::Msg::Hello(h)),
        }))) => h,
        Ok(Ok(Some(_))) => {
            let _ = out
                .send(Err(Status::invalid_argument(
                    "the first message must be Hello",
                )))
                .await;
            return;
        }
        _ => return,
    };
    let node = hello.node_id.clone();
    let cert_serial = hello.cert_serial.clone();
    let journal_id = hello.journal_id.clone();
    let applied_generation = hello.applied_generation;
    let input = HelloInput {
        node_id: hello.node_id,
        cert_fingerprint: fingerprint,
        cert_serial: hello.cert_serial,
        gateway_id: state.id.clone(),
        incarnation_id: hello.incarnation_id,
        boot_id: hello.boot_id,
        journal_id: hello.journal_id,
        agent_version: hello.agent_version,
        release_floor: hello.release_floor,
        last_epoch: hello.last_epoch,
        inventory_hashes: hello
            .inventory_hashes
            .into_iter()
            .map(|h| (h.section, h.sha256))
            .collect(),
        journal_running: hello.journal_running,
        journal_done: hello.journal_done,
    };
    let outcome = match state.store.run(move |s| s.hello(&input)).await {
        Ok(o) => o,
        Err(TxError::Refused(Refusal::Fenced(_))) => {
            state.fence("the store says another gateway holds the lease, or it ran out");
            let _ = out
                .send(Err(Status::unavailable(format!(
                    "gateway {} lost its lease; reconnect",
                    state.id
                ))))
                .await;
            return;
        }
        Err(e) => {
            let _ = out.send(Err(refusal_status(e))).await;
            return;
        }
    };
    drop(permit);
    let epoch = outcome.epoch;
    let span = info_span!("session", %node, epoch, gateway = %state.id);
    async move {
        let last_heard = Arc::new(Mutex::new(Instant::now()));
        let wake = Arc::new(Notify::new());
        let (close_tx, mut close_rx) = oneshot::channel();
        let (revoked_tx, mut revoked_rx) = oneshot::channel::<(String, String)>();
        let (drain_tx, mut drain_rx) = oneshot::channel::<Duration>();
        if let Some(mut old) = state.sessions().insert(
            node.clone(),
            LocalSession {
                epoch,
                cert_serial: cert_serial.clone(),
                revoked: Some(revoked_tx),
                cert_not_after_ms: outcome.cert_not_after_ms,
                last_heard: last_heard.clone(),
                close: Some(close_tx),
                wake: wake.clone(),
                drain: Some(drain_tx),
            },
        ) && let Some(tx) = old.close.take()
        {
            let _ = tx.send(Status::aborted("session superseded by a newer one"));
        }
        info!("session established");
        let welcome = Welcome {
            epoch,
            server_time_ms: outcome.server_time_ms,
            gateway_id: state.id.clone(),
            heartbeat_interval_ms: timing.heartbeat.as_millis() as u32,
            inventory_wanted: outcome.inventory_wanted,
        };
        if out
            .send(msg(server_message::Msg::Welcome(welcome)))
            .await
            .is_err()
        {
            end_session(&state, &node, epoch, Duration::ZERO, "stream-ended").await;
            return;
        }
        for (id, state, reason) in &outcome.finished {
            info!(cmd = %id, %state, %reason, "command finished at Hello");
        }
        // In-flight commands first, in sequence order, then what is pending.
        for d in outcome.replay {
            debug!(cmd = %d.id, seq = d.seq, "replaying");
            if !send_dispatch(&out, d, epoch).await {
                end_session(&state, &node, epoch, Duration::ZERO, "stream-ended").await;
                return;
            }
        }
        wake.notify_one();
        // The spec generation this session has: a full DesiredState goes
        // out whenever the store has a newer one.
        let mut sent_generation = applied_generation;
        // The gateway's work loop wakes the session when something waits
        // for it; this slow poll is only the safety net.
        let mut poll = tokio::time::interval(SESSION_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tick = tokio::time::interval(timing.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let dead_after = timing.heartbeat * timing.missed_heartbeats;
        loop {
            tokio::select! {
                Ok(within) = &mut drain_rx => {
                    info!(?within, "draining the session");
                    let _ = out
                        .send(msg(server_message::Msg::Drain(v1::Drain {
                            reconnect_within_ms: within.as_millis().min(u32::MAX as u128) as u32,
                            reason: "the gateway is shutting down".into(),
                        })))
                        .await;
                    end_session(&state, &node, epoch, Duration::ZERO, "drained").await;
                    return;
                }
                Ok((serial, reason)) = &mut revoked_rx => {
                    info!(%serial, %reason, "certificate revoked; closing the session");
                    let _ = out
                        .send(msg(server_message::Msg::Revocation(v1::RevocationNotice {
                            reason: reason.clone(),
                            serials: vec![serial],
                        })))
                        .await;
                    let _ = out
                        .send(Err(Status::unauthenticated(format!(
                            "the node certificate was revoked ({reason})"
                        ))))
                        .await;
                    end_session(&state, &node, epoch, Duration::ZERO, "revoked").await;
                    return;
                }
                _ = async { tokio::select! { _ = wake.notified() => {}, _ = poll.tick() => {} } } => {
                    if !send_spec(&state, &node, &mut sent_generation, &out).await
                        || !dispatch_pending(&state, &node, epoch, &out).await
                    {
                        end_session(&state, &node, epoch, Duration::ZERO, "stream-ended").await;
                        return;
                    }
                }
                status = &mut close_rx => {
                    // Superseded or fenced: another session owns the node's
                    // route now, so no disconnect write.
                    if let Ok(status) = status {
                        let _ = out.send(Err(status)).await;
                    }
                    unregister(&state, &node, epoch);
                    return;
                }
                m = inbound.message() => match m {
                    Ok(Some(m)) => {
                        *last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                        if !handle(&state, &node, &journal_id, epoch, m, &out).await {
                            end_session(&state, &node, epoch, Duration::ZERO, "stream-ended").await;
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        end_session(&state, &node, epoch, Duration::ZERO, "stream-ended").await;
                        return;
                    }
                },
                _ = tick.tick() => {
                    let silent = last_heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                    if silent >= dead_after {
                        info!(?silent, "missed heartbeats; closing the session");
                        let _ = out.send(Err(Status::unavailable(format!(
                            "no heartbeat for {}s; reconnect", silent.as_secs()
                        )))).await;
                        end_session(&state, &node, epoch, silent, "missed-heartbeats").await;
                        return;
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}

async fn send_dispatch(out: &Out, d: crate::store::Dispatch, epoch: u64) -> bool {
    out.send(msg(server_message::Msg::Command(v1::CommandDispatch {
        command_id: d.id,
        seq: d.seq,
        signed: d.signed,
        epoch,
    })))
    .await
    .is_ok()
}

/// Sends the node's spec if the store has a generation newer than the one
/// the session has; false when the stream is unusable.
async fn send_spec(state: &Arc<GatewayState>, node: &str, sent: &mut u64, out: &Out) -> bool {
    let n = node.to_string();
    match state.store.run(move |s| s.signed_spec(&n)).await {
        Ok(Some((generation, signed))) if generation > *sent => {
            debug!(generation, "sending the desired state");
            *sent = generation;
            out.send(msg(server_message::Msg::DesiredState(v1::DesiredState {
                generation,
                signed_spec: signed,
            })))
            .await
            .is_ok()
        }
        Ok(_) => true,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "cannot read the node's spec");
            true
        }
    }
}

/// Sends what is pending for the node; false when the stream is unusable.
async fn dispatch_pending(state: &Arc<GatewayState>, node: &str, epoch: u64, out: &Out) -> bool {
    let (gw, n) = (state.id.clone(), node.to_string());
    match state
        .store
        .run(move |s| s.take_dispatchable(&gw, &n, epoch))
        .await
    {
        Ok(ds) => {
            for d in ds {
                debug!(cmd = %d.id, seq = d.seq, "dispatching");
                if !send_dispatch(out, d, epoch).await {
                    return false;
                }
            }
            true
        }
        Err(e) => {
            warn!(error = %format!("{e:#}"), "cannot dispatch");
            true
        }
    }
}

/// Handles one message; false when the stream is unusable.
async fn handle(
    state: &Arc<GatewayState>,
    node: &str,
    journal_id: &str,
    epoch: u64,
    m: NodeMessage,
    out: &Out,
) -> bool {
    match m.msg {
        Some(node_message::Msg::Heartbeat(h)) => out
            .send(msg(server_message::Msg::HeartbeatAck(v1::HeartbeatAck {
                seq: h.seq,
                server_time_ms: state.clock.now_ms(),
            })))
            .await
            .is_ok(),
        Some(node_message::Msg::Inventory(inv)) => {
            if bcd_proto::fingerprint(&inv.body) != inv.sha256 || inv.body.len() > 1 << 20 {
                warn!(section = %inv.section, "inventory body does not match its hash or is too large; ignored");
                return true;
            }
            let node = node.to_string();
            if let Err(e) = state
                .store
                .run(move |s| s.put_inventory(&node, epoch, &inv.section, &inv.sha256, &inv.body))
                .await
            {
                warn!(error = %format!("{e:#}"), "cannot store inventory");
            }
            true
        }
        Some(node_message::Msg::CommandAck(a)) => {
            let running = a.state == "RUNNING";
            let (n, id) = (node.to_string(), a.command_id.clone());
            match state
                .store
                .run(move |s| s.command_ack(&n, &id, running))
                .await
            {
                Ok(true) => debug!(cmd = %a.command_id, state = %a.state, "command acknowledged"),
                Ok(false) => debug!(cmd = %a.command_id, "ack for a finished or unknown command"),
                Err(e) => warn!(error = %format!("{e:#}"), "cannot record a command ack"),
            }
            true
        }
        Some(node_message::Msg::CommandResult(r)) => {
            let Some(outcome) = bcd_core::command::Outcome::parse(&r.outcome) else {
                warn!(cmd = %r.command_id, outcome = %r.outcome, "result with an unknown outcome; ignored");
                return true;
            };
            let input = crate::store::ResultInput {
                command_id: r.command_id.clone(),
                outcome,
                reason: r.reason,
                exit_code: r.has_exit_code.then_some(r.exit_code),
                output: r.output,
                output_truncated: r.output_truncated,
            };
            let n = node.to_string();
            match state.store.run(move |s| s.command_result(&n, &input)).await {
                Ok(applied) => {
                    match applied {
                        crate::store::ResultApplied::Applied => {
                            info!(cmd = %r.command_id, outcome = %r.outcome, "command finished")
                        }
                        crate::store::ResultApplied::Duplicate => {
                            debug!(cmd = %r.command_id, "duplicate result; the first one stands")
                        }
                        crate::store::ResultApplied::Unknown => warn!(
                            cmd = %r.command_id,
                            "result for a command this server does not know; acknowledged and dropped"
                        ),
                    }
                    out.send(msg(server_message::Msg::ResultAck(v1::ResultAck {
                        command_ids: vec![r.command_id],
                    })))
                    .await
                    .is_ok()
                }
                // Not acknowledged: the node keeps it and sends it again.
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "cannot record a result");
                    true
                }
            }
        }
        Some(node_message::Msg::Events(batch)) => {
            // Oversized events are acknowledged and dropped, so the node
            // does not send them forever.
            let max_id = batch.events.iter().map(|e| e.id).max().unwrap_or(0);
            let events: Vec<(u64, String, Vec<u8>, u64)> = batch
                .events
                .into_iter()
                .filter(|e| e.kind.len() <= 128 && e.body.len() <= 64 << 10)
                .map(|e| (e.id, e.kind, e.body, e.age_ms))
                .collect();
            let (n, j) = (node.to_string(), journal_id.to_string());
            match state
                .store
                .run(move |s| s.put_events(&n, &j, &events))
                .await
            {
                Ok(_) => out
                    .send(msg(server_message::Msg::EventAck(v1::EventAck {
                        up_to: max_id,
                    })))
                    .await
                    .is_ok(),
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "cannot store events");
                    true
                }
            }
        }
        Some(node_message::Msg::AllocationBound(b)) => {
            let n = node.to_string();
            match state
                .store
                .run(move |s| s.record_binding(&n, &b.payload, &b.signature))
                .await
            {
                Ok(crate::store::BindingOutcome::Accepted) => debug!("binding accepted"),
                Ok(crate::store::BindingOutcome::Rejected(reason)) => {
                    warn!(%reason, "reservation.binding-rejected")
                }
                Ok(crate::store::BindingOutcome::MarkedLost(reason)) => {
                    warn!(%reason, "forged re-report of an active binding: marked lost")
                }
                Err(e) => warn!(error = %format!("{e:#}"), "cannot record a binding"),
            }
            true
        }
        Some(node_message::Msg::StateReport(r)) => {
            let sections: Vec<(String, String, String, u64)> = r
                .sections
                .into_iter()
                .take(32)
                .map(|s| {
                    (
                        s.section,
                        s.status,
                        s.message.chars().take(1024).collect(),
                        s.age_ms,
                    )
                })
                .collect();
            let n = node.to_string();
            let applied = r.applied_generation;
            if let Err(e) = state
                .store
                .run(move |s| s.put_state_report(&n, applied, &sections))
                .await
            {
                warn!(error = %format!("{e:#}"), "cannot record a state report");
            }
            // Commands waiting on this generation may go now.
            dispatch_pending(state, node, epoch, out).await
        }
        Some(node_message::Msg::Hello(_)) => {
            let _ = out
                .send(Err(Status::invalid_argument(
                    "Hello is only valid as the first message",
                )))
                .await;
            false
        }
        // Commands, events and state reports arrive in later protocol
        // versions; a gateway that does not know them yet ignores them.
        _ => true,
    }
}

fn unregister(state: &GatewayState, node: &str, epoch: u64) {
    let mut sessions = state.sessions();
    if sessions.get(node).is_some_and(|s| s.epoch == epoch) {
        sessions.remove(node);
    }
}

async fn end_session(
    state: &Arc<GatewayState>,
    node: &str,
    epoch: u64,
    age: Duration,
    cause: &'static str,
) {
    unregister(state, node, epoch);
    let n = node.to_string();
    match state
        .store
        .run(move |s| s.disconnect(&n, epoch, age, cause))
        .await
    {
        Ok(true) => info!(cause, "session ended"),
        Ok(false) => debug!(cause, "session ended; a newer session owns the node"),
        Err(e) => warn!(error = %format!("{e:#}"), "cannot record the disconnect"),
    }
}
