//! `bcd node`: the daemon's tokio shell around `bcd_core::Session`.
//!
//! The shell owns the I/O the session asks for: dialing the gateway over
//! mutual TLS, sending Hello and heartbeats, turning server messages and
//! stream ends into events, persisting the server time mark. Decisions (when
//! to dial, what to refuse, when the server counts as gone) are the core's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use bcd_core::command::{self, DispatchFacts, Journaled, Kind, NodeView, OnDispatch, Recovery};
use bcd_core::{Action, Event, Session, SessionConfig};
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{
    self, Hello, InventoryHash, NodeMessage, ServerMessage, gateway_client::GatewayClient,
    node_message, server_message,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Streaming;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::effects::{self, Effect};
use crate::failpoints::{Failpoints, Point};
use crate::hw::{self, Host};
use crate::identity::Identity;
use crate::journal::{EventBounds, EventClass, Journal};

/// Counters a fleet of agents in one process shares (the simulator's
/// progress display reads them).
#[derive(Debug, Default)]
pub struct Stats {
    pub connected: AtomicUsize,
    pub sessions: AtomicU64,
    pub dial_failures: AtomicU64,
    /// Unix milliseconds of the last session established, and its epoch.
    pub established_ms: std::sync::atomic::AtomicI64,
    pub epoch: AtomicU64,
}

#[derive(Debug)]
pub struct Agent {
    pub identity: Identity,
    pub host: Arc<dyn Host>,
    pub journal: Journal,
    pub incarnation_id: String,
    pub config: SessionConfig,
    pub seed: u64,
    pub stats: Option<Arc<Stats>>,
    /// Test builds only (`failpoints` feature): where to die.
    pub failpoints: Failpoints,
    /// The highest event id sent in this session.
    sent_events: u64,
    pub paths: crate::converge::Paths,
    /// How often the convergers re-check the machine.
    pub converge_every: Duration,
    /// The spec this node enforces (verified when it arrived).
    spec: Option<v1::NodeSpec>,
    pub access_paths: crate::access::AccessPaths,
    /// Each section's last status, with when it last changed.
    sections: std::collections::BTreeMap<&'static str, (crate::converge::Status, String, Instant)>,
    /// The last report sent.
    reported: Option<Vec<(String, String, String)>>,
    reported_generation: u64,
    /// Bindings reported in this session: allocation → GPU UUIDs.
    bound: std::collections::BTreeMap<String, Vec<String>>,
    /// Inventory hashes the server has, by section.
    inventory_known: std::collections::BTreeMap<String, String>,
    /// Self-update (none in `bcd sim`, whose agents share one process).
    pub update: Option<crate::upgrade::Updater>,
    /// Boot-clock deadline for an unconfirmed upgrade's first Welcome.
    upgrade_deadline: Option<u64>,
    /// Where a downloaded release goes back to the loop.
    staged: Option<mpsc::UnboundedSender<Staged>>,
}

/// How often the convergers re-check the machine.
const CONVERGE_EVERY: Duration = Duration::from_secs(30);

/// Certificate renewal retries back off from 30 s to 10 min.
const RENEW_RETRY_MIN: Duration = Duration::from_secs(30);
const RENEW_RETRY_MAX: Duration = Duration::from_secs(600);

/// How often the node journals a load-average metric.
const METRIC_EVERY: Duration = Duration::from_secs(60);
/// Events per batch on the stream.
const EVENT_BATCH: usize = 256;

/// Why the agent stopped.
#[derive(Debug)]
pub enum Stopped {
    /// Shutdown was requested.
    Shutdown,
    /// The server refused this node for good.
    Refused(String),
    /// A command rebooted the (fake) machine: start the agent again.
    Rebooted,
    /// The journal failed; the daemon must not act without it.
    JournalFailed(String),
    /// The `current` slot changed: start again from the binary it names.
    Restart,
    /// This binary is below the release floor and must not run.
    BelowFloor(String),
}

/// A downloaded, verified release written to the inactive slot, or why not.
type Staged = (String, Result<release::Manifest, String>);

/// A finished side effect on its way back to the loop.
type Done = (String, Effect);

struct Conn {
    tx: mpsc::Sender<NodeMessage>,
    rx: Streaming<ServerMessage>,
}

type DialResult = Result<Conn, String>;

impl Agent {
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Stopped {
        let span = info_span!("session", node = %self.identity.file.node_id);
        async move { self.run_inner(shutdown).await }
            .instrument(span)
            .await
    }

    async fn run_inner(&mut self, shutdown: impl std::future::Future<Output = ()>) -> Stopped {
        let start = Instant::now();
        let now = || start.elapsed();
        let mut session = Session::new(
            self.config,
            self.seed,
            self.identity.file.server_time_mark_ms,
            self.identity.file.last_epoch,
        );
        let mut dialing: Option<JoinHandle<DialResult>> = None;
        let mut conn: Option<Conn> = None;
        let mut wanted: Vec<String> = Vec::new();
        let mut counted = false;
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
        let (staged_tx, mut staged_rx) = mpsc::unbounded_channel::<Staged>();
        self.staged = Some(staged_tx);
        // Settle an upgrade a previous process started, then what it left
        // in the journal.
        match self.settle_update() {
            Ok(Some(stopped)) => return stopped,
            Ok(None) => {}
            Err(e) => return Stopped::JournalFailed(e),
        }
        match self.recover(&done_tx) {
            Ok(Some(stopped)) => return stopped,
            Ok(None) => {}
            Err(e) => return Stopped::JournalFailed(e),
        }
        // Certificate renewal at 60% of the certificate's life, retried
        // from 30 s doubling to 10 min.
        let mut renewing: Option<JoinHandle<Result<crate::join::Renewed, String>>> = None;
        let mut renew_backoff = bcd_core::Backoff::new(bcd_core::BackoffConfig {
            base: RENEW_RETRY_MIN,
            cap: RENEW_RETRY_MAX,
        });
        let mut renew_not_before = Duration::ZERO;
        tokio::pin!(shutdown);
        // The first metric after a full period: a fleet restarting at once
        // does not journal (and fsync) a metric per node all together.
        let mut metrics = tokio::time::interval_at(Instant::now() + METRIC_EVERY, METRIC_EVERY);
        metrics.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick converges at once: the last spec is enforced even
        // before (or without) a session.
        let mut converge = tokio::time::interval(self.converge_every);
        converge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = vec![Event::Tick];
        loop {
            for event in events.drain(..) {
                let actions = session.handle(now(), event);
                for action in actions {
                    match action {
                        Action::Dial => dialing = Some(self.spawn_dial()),
                        Action::SendHello {
                            last_epoch,
                            mark_ms,
                        } => {
                            let hello = match self.hello(last_epoch, mark_ms) {
                                Ok(h) => h,
                                Err(e) => return Stopped::JournalFailed(e),
                            };
                            send(&conn, node_message::Msg::Hello(hello)).await;
                        }
                        Action::SendHeartbeat { seq } => {
                            send(&conn, node_message::Msg::Heartbeat(v1::Heartbeat { seq })).await;
                        }
                        Action::Established {
                            epoch,
                            server_time_ms,
                        } => {
                            info!(epoch, server_time_ms, "session established");
                            if let Some(s) = &self.stats {
                                s.connected.fetch_add(1, Ordering::Relaxed);
                                s.sessions.fetch_add(1, Ordering::Relaxed);
                                s.epoch.store(epoch, Ordering::Relaxed);
                                s.established_ms
                                    .store(bcd_sys::clock::unix_ms(), Ordering::Relaxed);
                                counted = true;
                            }
                            self.send_inventory(&conn, Some(&wanted)).await;
                            // The first Welcome confirms a new release.
                            if let Err(e) = self.confirm_upgrade() {
                                return Stopped::JournalFailed(e);
                            }
                            // Results the server has not acknowledged, in
                            // sequence order, before anything new.
                            if let Err(e) = self.resend_results(&conn).await {
                                return Stopped::JournalFailed(e);
                            }
                            // A new session: the server acknowledges events
                            // from the start of this journal again.
                            self.sent_events = 0;
                            self.flush_events(&conn).await;
                            self.reported = None;
                            self.bound.clear();
                            self.report(&conn).await;
                        }
                        Action::Close { reason } => {
                            warn!(%reason, "closing the session");
                        }
                        Action::Disconnected { retry_in } => {
                            conn = None;
                            dialing = None;
                            self.uncount(&mut counted);
                            debug!(?retry_in, "disconnected");
                        }
                        Action::PersistMark { mark_ms, epoch } => {
                            self.identity.file.server_time_mark_ms = mark_ms;
                            self.identity.file.last_epoch = epoch;
                            if let Err(e) = self.identity.save_state() {
                                warn!(error = %format!("{e:#}"), "cannot persist the server time mark");
                            }
                        }
                        Action::Stop { message } => {
                            self.uncount(&mut counted);
                            self.persist_mark(&mut session, now());
                            return Stopped::Refused(message);
                        }
                    }
                }
            }
            let sleep_until = session
                .deadline()
                .map(|d| start + d)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let renew_due = {
                let t = now();
                let server_now = session
                    .clock()
                    .server_now(t)
                    .unwrap_or(session.clock().mark_ms());
                let wait_ms = (self.identity.renew_at_ms() - server_now).max(0) as u64;
                start + (t + Duration::from_millis(wait_ms)).max(renew_not_before)
            };
            tokio::select! {
                _ = tokio::time::sleep_until(renew_due), if renewing.is_none() => {
                    info!(serial = %self.identity.file.cert_serial, "renewing the node certificate");
                    renewing = Some(self.spawn_renewal());
                }
                r = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                    renewing = None;
                    match r.map_err(|e| e.to_string()).and_then(|r| r) {
                        Ok(renewed) => {
                            let serial = renewed.next.serial.clone();
                            if let Err(e) = self.identity.install_renewal(renewed.key_pem, renewed.cert, renewed.next) {
                                warn!(error = %format!("{e:#}"), "cannot install the renewed certificate");
                            } else {
                                info!(%serial, "certificate renewed; the next session uses it");
                                renew_backoff.reset();
                            }
                        }
                        Err(error) => {
                            let retry = renew_backoff.window();
                            let mut rng = bcd_core::SplitMix64::new(0);
                            renew_backoff.next_delay(&mut rng);
                            renew_not_before = now() + retry;
                            let expires_in = self.identity.file.cert_not_after_ms
                                - session.clock().server_now(now()).unwrap_or(session.clock().mark_ms());
                            warn!(%error, attempt = renew_backoff.attempt(), expires_in_ms = expires_in, ?retry, "renewal failed");
                        }
                    }
                }
                _ = &mut shutdown => {
                    self.uncount(&mut counted);
                    self.persist_mark(&mut session, now());
                    return Stopped::Shutdown;
                }
                _ = tokio::time::sleep_until(sleep_until) => events.push(Event::Tick),
                r = async { dialing.as_mut().expect("guarded").await }, if dialing.is_some() => {
                    dialing = None;
                    match r {
                        Ok(Ok(c)) => {
                            conn = Some(c);
                            events.push(Event::Connected);
                        }
                        Ok(Err(error)) => {
                            if let Some(s) = &self.stats {
                                s.dial_failures.fetch_add(1, Ordering::Relaxed);
                            }
                            debug!(%error, "dial failed");
                            events.push(Event::DialFailed { error });
                        }
                        Err(e) => events.push(Event::DialFailed { error: e.to_string() }),
                    }
                }
                _ = upgrade_sleep(self.upgrade_deadline) => {
                    self.upgrade_deadline = None;
                    let swapped = self
                        .update
                        .as_mut()
                        .map(|u| u.tick(crate::upgrade::boot_ms()))
                        .transpose();
                    match swapped {
                        Ok(Some(true)) => {
                            self.uncount(&mut counted);
                            self.persist_mark(&mut session, now());
                            return Stopped::Restart;
                        }
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "cannot swap back"),
                    }
                }
                Some((id, staged)) = staged_rx.recv() => {
                    match self.switch_release(&id, staged) {
                        Ok(()) => {
                            self.uncount(&mut counted);
                            self.persist_mark(&mut session, now());
                            return Stopped::Restart;
                        }
                        Err(reason) => {
                            warn!(cmd = %id, %reason, "upgrade refused; staying on the current release");
                            if let Err(e) = self.finish(&conn, &id, Effect::failed(reason)).await {
                                return Stopped::JournalFailed(e);
                            }
                            self.flush_events(&conn).await;
                        }
                    }
                }
                Some((id, effect)) = done_rx.recv() => {
                    self.failpoints.at(Point::MidEffect);
                    if let Err(e) = self.finish(&conn, &id, effect).await {
                        return Stopped::JournalFailed(e);
                    }
                    self.flush_events(&conn).await;
                }
                _ = converge.tick() => {
                    if let Err(e) = self.converge(&conn).await {
                        return Stopped::JournalFailed(e);
                    }
                    self.send_inventory(&conn, None).await;
                }
                _ = metrics.tick() => {
                    if let Some(load) = self.host.load_average() {
                        let body = serde_json::json!({"load1": load[0], "load5": load[1], "load15": load[2]});
                        self.event("node.load", EventClass::Metric, body.to_string().into_bytes());
                    }
                    self.flush_events(&conn).await;
                }
                m = async { conn.as_mut().expect("guarded").rx.message().await }, if conn.is_some() => {
                    let event = match m {
                        Ok(Some(msg)) => {
                            let server_now = session.clock().server_now(now());
                            match self.on_message(msg, &mut wanted, &conn, server_now, &done_tx).await {
                                Ok(ev) => {
                                    self.flush_events(&conn).await;
                                    ev
                                }
                                Err(stopped) => {
                                    self.uncount(&mut counted);
                                    self.persist_mark(&mut session, now());
                                    return stopped;
                                }
                            }
                        }
                        Ok(None) => Event::Closed { error: "the gateway ended the stream".into() },
                        Err(status) => match status.code() {
                            // The session's certificate ran out: the next
                            // session presents the renewed one.
                            tonic::Code::Unauthenticated
                                if status.message().starts_with("certificate expired") =>
                            {
                                Event::Closed { error: status.message().to_string() }
                            }
                            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                                Event::Refused { message: status.message().to_string() }
                            }
                            _ => Event::Closed { error: format!("{}: {}", status.code(), status.message()) },
                        },
                    };
                    events.push(event);
                }
            }
        }
    }

    fn uncount(&self, counted: &mut bool) {
        if std::mem::take(counted)
            && let Some(s) = &self.stats
        {
            s.connected.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn persist_mark(&mut self, session: &mut Session, now: Duration) {
        let mut clock = session.clock().clone();
        let mark = clock.advance(now);
        if mark != self.identity.file.server_time_mark_ms {
            self.identity.file.server_time_mark_ms = mark;
            if let Err(e) = self.identity.save_state() {
                warn!(error = %format!("{e:#}"), "cannot persist the server time mark");
            }
        }
    }

    async fn on_message(
        &mut self,
        msg: ServerMessage,
        wanted: &mut Vec<String>,
        conn: &Option<Conn>,
        server_now: Option<i64>,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<Event, Stopped> {
        Ok(match msg.msg {
            Some(server_message::Msg::Welcome(w)) => {
                *wanted = w.inventory_wanted;
                Event::Welcome {
                    epoch: w.epoch,
                    server_time_ms: w.server_time_ms,
                    heartbeat_interval: Duration::from_millis(u64::from(w.heartbeat_interval_ms)),
                }
            }
            Some(server_message::Msg::HeartbeatAck(a)) => Event::HeartbeatAck {
                server_time_ms: a.server_time_ms,
            },
            Some(server_message::Msg::Revocation(r)) => Event::Refused {
                message: format!(
                    "the node certificate was revoked ({}): join again: bcd join --reset --yes, \
                     then bcd join",
                    r.reason
                ),
            },
            Some(server_message::Msg::Drain(d)) => Event::Drain {
                within: Duration::from_millis(u64::from(d.reconnect_within_ms)),
            },
            Some(server_message::Msg::Command(d)) => {
                self.on_dispatch(d, conn, server_now, done)
                    .await
                    .map_err(|e| e.unwrap_or_else(Stopped::JournalFailed))?;
                Event::Received
            }
            Some(server_message::Msg::DesiredState(d)) => {
                self.on_desired_state(d, conn)
                    .await
                    .map_err(Stopped::JournalFailed)?;
                Event::Received
            }
            Some(server_message::Msg::EventAck(a)) => {
                self.journal
                    .ack_events(a.up_to)
                    .map_err(|e| Stopped::JournalFailed(e.to_string()))?;
                Event::Received
            }
            Some(server_message::Msg::ResultAck(a)) => {
                for id in a.command_ids {
                    self.failpoints.at(Point::BeforeAck);
                    self.journal
                        .mark_acked(&id)
                        .map_err(|e| Stopped::JournalFailed(e.to_string()))?;
                }
                Event::Received
            }
            _ => Event::Received,
        })
    }

    fn worker_keys(&self) -> Vec<Vec<u8>> {
        self.identity
            .file
            .worker_keys
            .iter()
            .filter_map(|k| hex::decode(k).ok())
            .collect()
    }

    /// Judges a dispatch by `bcd_core::command::on_dispatch` and acts on
    /// the decision. `Err(Ok(stopped))` ends the agent (a reboot);
    /// `Err(Err(message))` is a journal failure.
    async fn on_dispatch(
        &mut self,
        d: v1::CommandDispatch,
        conn: &Option<Conn>,
        server_now: Option<i64>,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<(), Result<Stopped, String>> {
        let journaled = self.journal.command(&d.command_id).map_err(journal_err)?;
        let opened = bcd_proto::sign::open(&d.signed, &self.worker_keys());
        let payload = opened
            .as_ref()
            .ok()
            .and_then(|p| v1::CommandPayload::decode(p.as_slice()).ok());
        let facts = DispatchFacts {
            signature: match (&opened, &payload) {
                (Err(e), _) => Err(e.to_string()),
                (Ok(_), None) => Err("the payload does not decode".to_string()),
                (Ok(_), Some(p)) if p.command_id != d.command_id || p.seq != d.seq => {
                    Err("the dispatch does not match its signed payload".to_string())
                }
                _ => Ok(()),
            },
            node_id: payload
                .as_ref()
                .map(|p| p.node_id.clone())
                .unwrap_or_default(),
            kind: payload.as_ref().map(|p| p.kind.clone()).unwrap_or_default(),
            seq: d.seq,
            not_after_ms: payload.as_ref().map_or(0, |p| p.not_after_ms),
            min_generation: payload.as_ref().map_or(0, |p| p.min_generation),
        };
        let view = NodeView {
            node_id: &self.identity.file.node_id,
            highest_seq: self.journal.highest_seq().map_err(journal_err)?,
            server_now_ms: server_now,
            applied_generation: self.journal.applied_generation().map_err(journal_err)?,
        };
        let decision = command::on_dispatch(journaled.as_ref().map(|e| &e.state), &facts, &view);
        debug!(cmd = %d.command_id, seq = d.seq, ?decision, "dispatch");
        match decision {
            OnDispatch::Accept => {
                let payload = payload.expect("accepted payloads decoded");
                self.journal
                    .accept(
                        &d.command_id,
                        d.seq,
                        &payload.kind,
                        &payload.encode_to_vec(),
                    )
                    .map_err(journal_err)?;
                self.failpoints.at(Point::AfterAccept);
                self.event(
                    "command.accepted",
                    EventClass::Transition,
                    serde_json::json!({"command_id": d.command_id, "seq": d.seq, "kind": payload.kind})
                        .to_string()
                        .into_bytes(),
                );
                send(conn, ack(&d.command_id, d.seq, "ACCEPTED")).await;
                if let Some(stopped) = self.start(&d.command_id, &payload, done).map_err(Err)? {
                    return Err(Ok(stopped));
                }
            }
            OnDispatch::Reattach => send(conn, ack(&d.command_id, d.seq, "RUNNING")).await,
            OnDispatch::ResendResult => {
                if let Some(r) = journaled.and_then(|e| e.result)
                    && let Ok(r) = v1::CommandResult::decode(r.as_slice())
                {
                    send(conn, node_message::Msg::CommandResult(r)).await;
                }
            }
            OnDispatch::Reject(rejection) => {
                warn!(cmd = %d.command_id, %rejection, "command rejected");
                let result = v1::CommandResult {
                    command_id: d.command_id.clone(),
                    seq: d.seq,
                    outcome: rejection.outcome().name().to_string(),
                    reason: rejection.to_string(),
                    ..Default::default()
                };
                // A well-formed command of ours that came too late is
                // journaled, so a replay gets the same answer; anything
                // that does not verify is answered and forgotten.
                if let (
                    command::Rejection::Expired { .. }
                    | command::Rejection::BelowMinGeneration { .. },
                    Some(p),
                ) = (&rejection, &payload)
                {
                    self.journal
                        .accept(&d.command_id, d.seq, &p.kind, &p.encode_to_vec())
                        .and_then(|()| self.journal.finish(&d.command_id, &result.encode_to_vec()))
                        .map_err(journal_err)?;
                }
                send(conn, node_message::Msg::CommandResult(result)).await;
            }
        }
        Ok(())
    }

    /// Starts an accepted command: journals `running` with the boot id, then
    /// the side effect. A self-terminating command on a fake machine returns
    /// `Some(Stopped::Rebooted)`.
    fn start(
        &mut self,
        id: &str,
        payload: &v1::CommandPayload,
        done: &mpsc::UnboundedSender<Done>,
    ) -> Result<Option<Stopped>, String> {
        let boot_id = self.host.boot_id().map_err(|e| format!("boot id: {e}"))?;
        self.journal
            .set_running(id, &boot_id)
            .map_err(|e| format!("journal: {e}"))?;
        self.failpoints.at(Point::AfterRunning);
        self.event(
            "command.running",
            EventClass::Transition,
            serde_json::json!({"command_id": id, "boot_id": boot_id})
                .to_string()
                .into_bytes(),
        );
        let id = id.to_string();
        let kind = Kind::parse(&payload.kind);
        info!(cmd = %id, kind = %payload.kind, "running");
        match (kind, payload.args.clone()) {
            (Some(Kind::ExecRun), Some(v1::command_payload::Args::Exec(args))) => {
                let done = done.clone();
                tokio::spawn(async move {
                    let effect = effects::exec(&args).await;
                    let _ = done.send((id, effect));
                });
            }
            (Some(Kind::InventoryRefresh), _) => {
                let _ = done.send((id, Effect::ok()));
            }
            (Some(Kind::GpuReset), Some(v1::command_payload::Args::GpuReset(a))) => {
                match self.resolve_for_reset(&a.gpu) {
                    Err(reason) => {
                        let _ = done.send((id, Effect::failed(reason)));
                    }
                    Ok(pci) => {
                        let host = self.host.clone();
                        let done = done.clone();
                        tokio::task::spawn_blocking(move || {
                            let effect = match host.gpus().reset(&pci) {
                                Ok(how) => Effect {
                                    output: format!("{pci}: {how}\n").into_bytes(),
                                    ..Effect::ok()
                                },
                                Err(e) => Effect::failed(format!("reset {pci}: {e}")),
                            };
                            let _ = done.send((id, effect));
                        });
                    }
                }
            }
            (Some(Kind::NodeReboot), _) => {
                info!("rebooting");
                match self.host.reboot() {
                    Ok(()) => return Ok(Some(Stopped::Rebooted)),
                    Err(e) => {
                        let _ = done.send((id, Effect::failed(format!("reboot: {e}"))));
                    }
                }
            }
            (Some(Kind::BootKexec), Some(v1::command_payload::Args::Kexec(k))) => {
                info!(kernel = %k.kernel, "kexec");
                match self.host.kexec(&k.kernel, &k.initrd, &k.cmdline) {
                    Ok(()) => return Ok(Some(Stopped::Rebooted)),
                    Err(e) => {
                        let _ = done.send((id, Effect::failed(format!("kexec: {e}"))));
                    }
                }
            }
            (Some(Kind::DaemonUpgrade), Some(v1::command_payload::Args::Upgrade(u))) => {
                self.stage_release(id, u.sequence, done);
            }
            (Some(Kind::DaemonRollback), _) => {
                let Some(update) = self.update.as_mut() else {
                    let _ = done.send((id, Effect::failed("self-update is not available here")));
                    return Ok(None);
                };
                let (output, restart) = update.abort().map_err(|e| format!("slots: {e}"))?;
                if restart {
                    // The result is journaled before the switch takes
                    // effect; the old binary sends it.
                    self.journal_result(
                        &id,
                        Effect {
                            output: output.into_bytes(),
                            ..Effect::ok()
                        },
                    )?;
                    return Ok(Some(Stopped::Restart));
                }
                let _ = done.send((
                    id,
                    Effect {
                        output: output.into_bytes(),
                        ..Effect::ok()
                    },
                ));
            }
            _ => {
                let _ = done.send((id, Effect::failed("arguments do not match the kind")));
            }
        }
        Ok(None)
    }

    /// `daemon.upgrade`: refuses at once what the update state refuses,
    /// then downloads, verifies and writes the release to the inactive slot
    /// in the background; the loop switches (`switch_release`).
    fn stage_release(&mut self, id: String, sequence: u64, done: &mpsc::UnboundedSender<Done>) {
        let (Some(update), Some(staged)) = (self.update.as_ref(), self.staged.clone()) else {
            let _ = done.send((id, Effect::failed("self-update is not available here")));
            return;
        };
        if let Err(refusal) = update.plan(sequence) {
            let _ = done.send((id, Effect::failed(refusal.to_string())));
            return;
        }
        let identity = self.identity.clone();
        let slots_dir = update.slots.clone();
        let state = update.state.clone();
        let confirm_within = update.confirm_within;
        tokio::spawn(async move {
            let result = match crate::join::fetch_release(&identity, sequence).await {
                Err(e) => Err(e),
                Ok((manifest, binary)) => tokio::task::spawn_blocking(move || {
                    let writer = crate::upgrade::Updater {
                        slots: slots_dir,
                        state,
                        confirm_within,
                        supervised: false,
                    };
                    writer.write(manifest.sequence, &binary).map(|_| manifest)
                })
                .await
                .unwrap_or_else(|e| Err(format!("writing the slot: {e}"))),
            };
            let _ = staged.send((id, result));
        });
    }

    /// A release is in the inactive slot: record the upgrade and switch
    /// (the caller restarts), or say why not.
    fn switch_release(
        &mut self,
        id: &str,
        staged: Result<release::Manifest, String>,
    ) -> Result<(), String> {
        let manifest = staged?;
        let update = self.update.as_mut().expect("staged only with an updater");
        update.switch(id, &manifest, crate::upgrade::boot_ms())?;
        self.failpoints.at(Point::AfterSwitch);
        Ok(())
    }

    /// At start: settles what the update state says about a previous
    /// process's upgrade.
    fn settle_update(&mut self) -> Result<Option<Stopped>, String> {
        let Some(update) = self.update.as_mut() else {
            return Ok(None);
        };
        let at_start = match update.start(crate::upgrade::boot_ms()) {
            Ok(a) => a,
            Err(e @ crate::upgrade::UpgradeError::BelowFloor { .. }) => {
                return Ok(Some(Stopped::BelowFloor(e.to_string())));
            }
            Err(e) => return Err(format!("update state: {e}")),
        };
        match at_start {
            crate::upgrade::AtStart::Run => {}
            crate::upgrade::AtStart::AwaitWelcome { deadline_ms } => {
                info!(
                    in_ms = deadline_ms.saturating_sub(crate::upgrade::boot_ms()),
                    "running a new release; it confirms on its first Welcome"
                );
                self.upgrade_deadline = Some(deadline_ms);
            }
            crate::upgrade::AtStart::Restart => return Ok(Some(Stopped::Restart)),
            crate::upgrade::AtStart::Finished {
                command_id,
                succeeded,
                reason,
                output,
            } => {
                warn!(cmd = %command_id, reason, "the upgrade did not confirm; this is the previous release");
                let effect = Effect {
                    outcome: if succeeded {
                        command::Outcome::Succeeded
                    } else {
                        command::Outcome::Failed
                    },
                    reason: reason.to_string(),
                    output: output.into_bytes(),
                    ..Effect::ok()
                };
                self.journal_result_if_running(&command_id, effect)?;
                self.update
                    .as_ref()
                    .expect("checked above")
                    .settled()
                    .map_err(|e| format!("update state: {e}"))?;
            }
        }
        Ok(None)
    }

    /// The first Welcome of a new release: journal SUCCEEDED, then raise
    /// the floor on disk.
    fn confirm_upgrade(&mut self) -> Result<(), String> {
        let Some(confirmed) = self.update.as_mut().and_then(|u| u.welcome()) else {
            return Ok(());
        };
        let id = confirmed.command_id;
        self.upgrade_deadline = None;
        info!(cmd = %id, "the new release is confirmed");
        self.journal_result_if_running(
            &id,
            Effect {
                output: confirmed.output.into_bytes(),
                ..Effect::ok()
            },
        )?;
        // A release signed with the current key rotated it: from now on
        // only the new key signs releases this node installs. Installed
        // before the update state is saved, so a crash here confirms (and
        // installs) again at the next Welcome.
        if let Some(key) = confirmed.next_key
            && self.identity.file.release_keys != [key.clone()]
        {
            info!(key = %key, "rotating the release key");
            self.identity.file.release_keys = vec![key];
            self.identity
                .save_state()
                .map_err(|e| format!("cannot save the rotated release key: {e:#}"))?;
        }
        self.update
            .as_ref()
            .expect("confirmed through it")
            .settled()
            .map_err(|e| format!("update state: {e}"))
    }

    /// Journals a result for a command the journal holds as running (a
    /// lost journal holds nothing: the server settles it as journal-lost).
    fn journal_result_if_running(&mut self, id: &str, effect: Effect) -> Result<(), String> {
        match self
            .journal
            .command(id)
            .map_err(|e| format!("journal: {e}"))?
        {
            Some(e) if matches!(e.state, Journaled::Running { .. } | Journaled::Accepted) => {
                self.journal_result(id, effect).map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// Journals a finished side effect's result, then sends it.
    async fn finish(
        &mut self,
        conn: &Option<Conn>,
        id: &str,
        effect: Effect,
    ) -> Result<(), String> {
        let Some((result, kind)) = self.journal_result(id, effect)? else {
            return Ok(());
        };
        self.failpoints.at(Point::AfterResult);
        if kind == Some(Kind::InventoryRefresh) {
            self.inventory_known.clear();
            self.send_inventory(conn, None).await;
        }
        send(conn, node_message::Msg::CommandResult(result)).await;
        Ok(())
    }

    /// Journals a command's result (sent later: now by `finish`, or after
    /// the next Welcome).
    fn journal_result(
        &mut self,
        id: &str,
        effect: Effect,
    ) -> Result<Option<(v1::CommandResult, Option<Kind>)>, String> {
        let Some(entry) = self
            .journal
            .command(id)
            .map_err(|e| format!("journal: {e}"))?
        else {
            warn!(cmd = %id, "a side effect finished for a command the journal does not hold");
            return Ok(None);
        };
        let result = v1::CommandResult {
            command_id: id.to_string(),
            seq: entry.seq,
            outcome: effect.outcome.name().to_string(),
            reason: effect.reason,
            exit_code: effect.exit_code.unwrap_or(0),
            has_exit_code: effect.exit_code.is_some(),
            output: effect.output,
            output_truncated: effect.truncated,
            boot_id: self.host.boot_id().unwrap_or_default(),
        };
        self.journal
            .finish(id, &result.encode_to_vec())
            .map_err(|e| format!("journal: {e}"))?;
        info!(cmd = %id, outcome = %result.outcome, "finished");
        self.finished_event(&result);
        Ok(Some((result, Kind::parse(&entry.kind))))
    }

    /// On start: runs what was accepted and never started, finishes what
    /// was running (`rebooted` after a new boot, `interrupted` otherwise).
    fn recover(&mut self, done: &mpsc::UnboundedSender<Done>) -> Result<Option<Stopped>, String> {
        let boot_id = self.host.boot_id().map_err(|e| format!("boot id: {e}"))?;
        let entries = self
            .journal
            .open_entries()
            .map_err(|e| format!("journal: {e}"))?;
        for e in entries {
            match command::recover(Kind::parse(&e.kind), &e.state, &boot_id) {
                Recovery::Run => {
                    let Ok(payload) = v1::CommandPayload::decode(e.payload.as_slice()) else {
                        let _ =
                            done.send((e.id, Effect::failed("journaled payload does not decode")));
                        continue;
                    };
                    info!(cmd = %e.id, "recovery: running a command accepted before the restart");
                    if let Some(stopped) = self.start(&e.id, &payload, done)? {
                        return Ok(Some(stopped));
                    }
                }
                Recovery::Finish(outcome, reason) => {
                    info!(cmd = %e.id, outcome = outcome.name(), reason, "recovery: settling a command");
                    self.journal_result(
                        &e.id,
                        Effect {
                            outcome,
                            reason: reason.to_string(),
                            ..Effect::ok()
                        },
                    )?;
                }
                Recovery::Upgrade => {
                    // The update state settled it at start, or settles it
                    // at the first Welcome; with no record there, the
                    // process stopped before the switch.
                    let pending = self
                        .update
                        .as_ref()
                        .and_then(|u| u.pending_command())
                        .is_some_and(|p| p == e.id);
                    if !pending {
                        info!(cmd = %e.id, "recovery: an upgrade stopped before the switch");
                        self.journal_result(&e.id, Effect::failed(command::reason::INTERRUPTED))?;
                    }
                }
                Recovery::Resend | Recovery::Nothing => {}
            }
        }
        Ok(None)
    }

    /// A new spec from the server: verified, journaled, converged.
    async fn on_desired_state(
        &mut self,
        d: v1::DesiredState,
        conn: &Option<Conn>,
    ) -> Result<(), String> {
        let current = self.spec.as_ref().map_or(0, |s| s.generation);
        let verdict = bcd_proto::sign::open(&d.signed_spec, &self.worker_keys())
            .map_err(|e| e.to_string())
            .and_then(|p| {
                v1::NodeSpec::decode(p.as_slice()).map_err(|e| format!("does not decode: {e}"))
            })
            .and_then(|spec| {
                if spec.node_id != self.identity.file.node_id {
                    Err(format!("it is for node {}", spec.node_id))
                } else if spec.generation < current {
                    Err(format!(
                        "generation {} is older than {current}",
                        spec.generation
                    ))
                } else {
                    Ok(spec)
                }
            });
        let spec = match verdict {
            Ok(s) => s,
            Err(reason) => {
                warn!(generation = d.generation, %reason, "spec refused; the last good one stays enforced");
                self.event(
                    "spec.refused",
                    EventClass::Transition,
                    serde_json::json!({"generation": d.generation, "reason": reason})
                        .to_string()
                        .into_bytes(),
                );
                return Ok(());
            }
        };
        if spec.generation == current {
            return Ok(());
        }
        self.journal
            .set_spec(spec.generation, &d.signed_spec)
            .map_err(|e| format!("journal: {e}"))?;
        info!(generation = spec.generation, "new spec");
        self.spec = Some(spec);
        self.converge(conn).await
    }

    /// One pass of the convergers; reports when something changed.
    async fn converge(&mut self, conn: &Option<Conn>) -> Result<(), String> {
        use crate::converge::{Outcome, Status};
        let Some(spec) = self.spec.clone() else {
            return Ok(());
        };
        let inv = self.host.gpus().cdi_inventory();
        let devices = match &inv {
            Ok(inv) => crate::converge::devices(&self.paths, &spec, inv),
            Err(e) => Outcome {
                status: Status::Progressing,
                message: format!("cannot read the GPU inventory: {e}"),
                changed: false,
            },
        };
        if devices.status == Status::Ready
            && let Ok(inv) = &inv
        {
            self.report_bindings(conn, &spec, inv).await;
        }
        let access =
            crate::access::converge(&self.access_paths, &spec.access.clone().unwrap_or_default());
        let mut all_ready = true;
        for (name, outcome) in [("devices", devices), ("access", access)] {
            if outcome.changed {
                info!(generation = spec.generation, section = name, "converged");
            }
            all_ready &= outcome.status == Status::Ready;
            let changed = self
                .sections
                .get(name)
                .is_none_or(|(s, m, _)| *s != outcome.status || *m != outcome.message);
            if changed {
                if outcome.status != Status::Ready {
                    warn!(section = name, status = outcome.status.name(), message = %outcome.message, "not converged");
                }
                self.sections
                    .insert(name, (outcome.status, outcome.message, Instant::now()));
            }
        }
        if all_ready
            && self
                .journal
                .applied_generation()
                .map_err(|e| format!("journal: {e}"))?
                != spec.generation
        {
            self.journal
                .set_applied_generation(spec.generation)
                .map_err(|e| format!("journal: {e}"))?;
        }
        self.report(conn).await;
        Ok(())
    }

    /// Reports each active GPU binding once per session, signed by the node
    /// key, so the server can tell it from anything a gateway makes up.
    async fn report_bindings(
        &mut self,
        conn: &Option<Conn>,
        spec: &v1::NodeSpec,
        inv: &cdi::nvidia::Inventory,
    ) {
        if conn.is_none() {
            return;
        }
        let Ok(key) = rcgen::KeyPair::from_pem(&self.identity.key_pem) else {
            return;
        };
        let assignments = spec
            .devices
            .as_ref()
            .map(|d| d.assignments.clone())
            .unwrap_or_default();
        self.bound
            .retain(|a, _| assignments.iter().any(|x| x.allocation_id == *a));
        for a in assignments {
            let mut uuids: Vec<String> = a
                .gpus
                .iter()
                .filter_map(|r| {
                    inv.gpus
                        .iter()
                        .find(|g| {
                            g.uuid.as_deref() == Some(r.as_str()) || g.index.to_string() == *r
                        })
                        .map(|g| g.uuid.clone().unwrap_or_else(|| g.index.to_string()))
                })
                .collect();
            uuids.sort();
            if self.bound.get(&a.allocation_id) == Some(&uuids) {
                continue;
            }
            let payload = v1::BindingPayload {
                node_id: self.identity.file.node_id.clone(),
                allocation_id: a.allocation_id.clone(),
                gpu_uuids: uuids.clone(),
                spec_generation: spec.generation,
                nonce: crate::journal::new_id(),
            }
            .encode_to_vec();
            let Ok(signature) = rcgen::SigningKey::sign(&key, &payload) else {
                warn!(allocation = %a.allocation_id, "cannot sign the binding report");
                continue;
            };
            send(
                conn,
                node_message::Msg::AllocationBound(v1::AllocationBound { payload, signature }),
            )
            .await;
            self.bound.insert(a.allocation_id, uuids);
        }
    }

    /// Sends a StateReport if it says something new.
    async fn report(&mut self, conn: &Option<Conn>) {
        if conn.is_none() {
            return;
        }
        let applied = self.journal.applied_generation().unwrap_or(0);
        if self.spec.is_none() && applied == 0 && self.sections.is_empty() {
            // Nothing to say yet: a node without a spec costs no write.
            return;
        }
        let now: Vec<(String, String, String)> = self
            .sections
            .iter()
            .map(|(n, (s, m, _))| (n.to_string(), s.name().to_string(), m.clone()))
            .collect();
        if self.reported.as_ref() == Some(&now) && self.reported_generation == applied {
            return;
        }
        let sections = self
            .sections
            .iter()
            .map(|(n, (s, m, since))| v1::SectionStatus {
                section: n.to_string(),
                status: s.name().into(),
                message: m.clone(),
                age_ms: since.elapsed().as_millis() as u64,
            })
            .collect();
        self.reported = Some(now);
        self.reported_generation = applied;
        send(
            conn,
            node_message::Msg::StateReport(v1::StateReport {
                applied_generation: applied,
                sections,
            }),
        )
        .await;
    }

    /// Journals an event; a journal that cannot take it is logged, not
    /// fatal: events are reports, not decisions.
    fn event(&mut self, kind: &str, class: EventClass, body: Vec<u8>) {
        match self
            .journal
            .push_event(kind, class, &body, EventBounds::default())
        {
            Ok(true) => {}
            Ok(false) => debug!(kind, "journal full: metric event dropped"),
            Err(e) => warn!(kind, error = %e, "cannot journal an event"),
        }
    }

    fn finished_event(&mut self, r: &v1::CommandResult) {
        let body = serde_json::json!({
            "command_id": r.command_id, "outcome": r.outcome, "reason": r.reason,
        });
        self.event(
            "command.finished",
            EventClass::Result,
            body.to_string().into_bytes(),
        );
    }

    /// Sends journaled events not yet sent in this session.
    async fn flush_events(&mut self, conn: &Option<Conn>) {
        if conn.is_none() {
            return;
        }
        loop {
            let batch = match self.journal.events_after(self.sent_events, EVENT_BATCH) {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "cannot read events");
                    return;
                }
            };
            let Some(last) = batch.last().map(|e| e.id) else {
                return;
            };
            let full = batch.len() == EVENT_BATCH;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let events = batch
                .into_iter()
                .map(|e| v1::Event {
                    id: e.id,
                    kind: e.kind,
                    body: e.body,
                    age_ms: (now - e.created_ms).max(0) as u64,
                })
                .collect();
            send(conn, node_message::Msg::Events(v1::EventBatch { events })).await;
            self.sent_events = last;
            if !full {
                return;
            }
        }
    }

    async fn resend_results(&mut self, conn: &Option<Conn>) -> Result<(), String> {
        for e in self
            .journal
            .open_entries()
            .map_err(|e| format!("journal: {e}"))?
        {
            if let (Journaled::Done { acked: false }, Some(r)) = (&e.state, &e.result)
                && let Ok(r) = v1::CommandResult::decode(r.as_slice())
            {
                send(conn, node_message::Msg::CommandResult(r)).await;
            }
        }
        Ok(())
    }

    /// Sends inventory sections: after a Welcome the ones the server asked
    /// for; otherwise the ones whose hash changed since the server last
    /// had them (a GPU that appeared or vanished shows up within a pass).
    async fn send_inventory(&mut self, conn: &Option<Conn>, wanted: Option<&[String]>) {
        if conn.is_none() {
            return;
        }
        for section in hw::inventory(self.host.as_ref()) {
            let needed = match wanted {
                Some(w) => w.iter().any(|w| w == section.name),
                None => self.inventory_known.get(section.name) != Some(&section.sha256),
            };
            self.inventory_known
                .insert(section.name.to_string(), section.sha256.clone());
            if needed {
                send(
                    conn,
                    node_message::Msg::Inventory(v1::Inventory {
                        section: section.name.to_string(),
                        sha256: section.sha256,
                        body: section.body,
                    }),
                )
                .await;
            }
        }
    }

    fn hello(&self, last_epoch: u64, mark_ms: i64) -> Result<Hello, String> {
        let boot_id = self.host.boot_id().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the boot id");
            String::new()
        });
        // The version of the release `current` holds, not the binary's claim.
        let (version, release_floor) = match &self.update {
            Some(u) => u.report(),
            None => (env!("CARGO_PKG_VERSION").to_string(), 0),
        };
        let mut journal_running = Vec::new();
        let mut journal_done = Vec::new();
        for e in self
            .journal
            .open_entries()
            .map_err(|e| format!("journal: {e}"))?
        {
            match e.state {
                Journaled::Done { .. } => journal_done.push(e.id),
                _ => journal_running.push(e.id),
            }
        }
        Ok(Hello {
            node_id: self.identity.file.node_id.clone(),
            cert_serial: self.identity.file.cert_serial.clone(),
            incarnation_id: self.incarnation_id.clone(),
            boot_id,
            journal_id: self.journal.journal_id().to_string(),
            inventory_hashes: hw::inventory(self.host.as_ref())
                .into_iter()
                .map(|s| InventoryHash {
                    section: s.name.to_string(),
                    sha256: s.sha256,
                })
                .collect(),
            agent_version: version,
            last_epoch,
            release_floor,
            server_time_mark_ms: mark_ms,
            journal_running,
            journal_done,
            applied_generation: self
                .journal
                .applied_generation()
                .map_err(|e| format!("journal: {e}"))?,
        })
    }

    /// The PCI address of a GPU named by UUID, index or address, unless the
    /// spec has it assigned (in use by a workload).
    fn resolve_for_reset(&self, gpu: &str) -> Result<String, String> {
        let gpus = self
            .host
            .gpus()
            .list()
            .map_err(|e| format!("GPU inventory: {e}"))?;
        let g = gpus
            .iter()
            .find(|g| {
                g.pci_address == gpu
                    || g.uuid.as_deref() == Some(gpu)
                    || g.minor.is_some_and(|m| m.to_string() == gpu)
            })
            .ok_or_else(|| format!("GPU {gpu} is not on this node"))?;
        let names: Vec<String> = [g.uuid.clone(), g.minor.map(|m| m.to_string())]
            .into_iter()
            .flatten()
            .collect();
        let assignments = self
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .map(|d| d.assignments.clone())
            .unwrap_or_default();
        if let Some(a) = assignments.iter().find(|a| {
            a.gpus
                .iter()
                .any(|r| names.contains(r) || *r == g.pci_address)
        }) {
            return Err(format!(
                "GPU {gpu} is assigned to allocation {} and in use: unassign it first",
                a.allocation_id
            ));
        }
        Ok(g.pci_address.clone())
    }

    fn spawn_renewal(&self) -> JoinHandle<Result<crate::join::Renewed, String>> {
        let server = self.identity.file.server.clone();
        let ca = self.identity.ca.clone();
        let current = ClientIdentity {
            chain: vec![self.identity.cert.clone()],
            key: self.identity.private_key(),
        };
        let hostname = self.host.hostname();
        tokio::spawn(async move {
            crate::join::renew_certificate(&server, ca, current, &hostname).await
        })
    }

    fn spawn_dial(&self) -> JoinHandle<DialResult> {
        let server = self.identity.file.server.clone();
        let trust = ServerTrust::Ca(self.identity.ca.clone());
        let id = ClientIdentity {
            chain: vec![self.identity.cert.clone()],
            key: self.identity.private_key(),
        };
        tokio::spawn(async move {
            let config = tls::client_config(trust, Some(id)).map_err(|e| format!("{e:#}"))?;
            let channel = tls::connect(&server, config)
                .await
                .map_err(|e| bcd_sys::error::chain(&e))?;
            let (tx, rx) = mpsc::channel(64);
            let stream = GatewayClient::new(channel)
                .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(|s| format!("{}: {}", s.code(), s.message()))?
                .into_inner();
            Ok(Conn { tx, rx: stream })
        })
    }
}

fn journal_err(e: rusqlite::Error) -> Result<Stopped, String> {
    Err(format!("journal: {e}"))
}

fn ack(id: &str, seq: u64, state: &str) -> node_message::Msg {
    node_message::Msg::CommandAck(v1::CommandAck {
        command_id: id.to_string(),
        seq,
        state: state.to_string(),
        reason: String::new(),
    })
}

async fn send(conn: &Option<Conn>, msg: node_message::Msg) {
    if let Some(c) = conn {
        // A failed send means the stream is gone; its end arrives as an event.
        let _ = c.tx.send(NodeMessage { msg: Some(msg) }).await;
    }
}

/// Opens what `bcd node` needs from the data directory.
pub fn open(
    dir: &std::path::Path,
    host: Arc<dyn Host>,
    seed: u64,
    stats: Option<Arc<Stats>>,
    paths: crate::converge::Paths,
    access_paths: crate::access::AccessPaths,
) -> anyhow::Result<Agent> {
    let identity = Identity::load(dir)?;
    let (journal, opened) = Journal::open(&dir.join(crate::identity::JOURNAL))
        .context("the journal cannot be opened")?;
    if let crate::journal::Opened::Recreated { corrupt } = &opened {
        warn!(aside = %corrupt.display(), "started a new journal; the old one did not open");
    }
    // The spec was verified when it arrived; a journaled one that no longer
    // opens (worker keys changed) is not enforced.
    let keys: Vec<Vec<u8>> = identity
        .file
        .worker_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    let spec = journal
        .spec()
        .context("the journal cannot be read")?
        .and_then(|(_, signed)| bcd_proto::sign::open(&signed, &keys).ok())
        .and_then(|p| v1::NodeSpec::decode(p.as_slice()).ok());
    Ok(Agent {
        identity,
        host,
        journal,
        incarnation_id: crate::journal::new_id(),
        config: SessionConfig::default(),
        seed,
        stats,
        failpoints: Failpoints::none(),
        sent_events: 0,
        paths,
        converge_every: CONVERGE_EVERY,
        spec,
        access_paths,
        sections: Default::default(),
        reported: None,
        reported_generation: 0,
        bound: Default::default(),
        inventory_known: Default::default(),
        update: None,
        upgrade_deadline: None,
        staged: None,
    })
}

/// Sleeps until a boot-clock deadline; forever without one.
async fn upgrade_sleep(deadline_ms: Option<u64>) {
    match deadline_ms {
        Some(d) => {
            let wait = d.saturating_sub(crate::upgrade::boot_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        None => std::future::pending().await,
    }
}
