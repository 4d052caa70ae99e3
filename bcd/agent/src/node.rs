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
use bcd_core::{Action, Event, Session, SessionConfig};
use bcd_proto::tls::{self, ClientIdentity, ServerTrust};
use bcd_proto::v1::{
    self, Hello, InventoryHash, NodeMessage, ServerMessage, gateway_client::GatewayClient,
    node_message, server_message,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Streaming;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::hw::{self, Host};
use crate::identity::Identity;
use crate::journal::Journal;

/// Counters a fleet of agents in one process shares (the simulator's
/// progress display reads them).
#[derive(Debug, Default)]
pub struct Stats {
    pub connected: AtomicUsize,
    pub sessions: AtomicU64,
    pub dial_failures: AtomicU64,
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
}

/// Why the agent stopped.
#[derive(Debug)]
pub enum Stopped {
    /// Shutdown was requested.
    Shutdown,
    /// The server refused this node for good.
    Refused(String),
}

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
        tokio::pin!(shutdown);
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
                            let hello = self.hello(last_epoch, mark_ms);
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
                                counted = true;
                            }
                            for section in hw::inventory(self.host.as_ref()) {
                                if wanted.iter().any(|w| w == section.name) {
                                    send(
                                        &conn,
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
            tokio::select! {
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
                m = async { conn.as_mut().expect("guarded").rx.message().await }, if conn.is_some() => {
                    events.push(match m {
                        Ok(Some(msg)) => self.on_message(msg, &mut wanted),
                        Ok(None) => Event::Closed { error: "the gateway ended the stream".into() },
                        Err(status) => match status.code() {
                            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                                Event::Refused { message: status.message().to_string() }
                            }
                            _ => Event::Closed { error: format!("{}: {}", status.code(), status.message()) },
                        },
                    });
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

    fn on_message(&self, msg: ServerMessage, wanted: &mut Vec<String>) -> Event {
        match msg.msg {
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
            _ => Event::Received,
        }
    }

    fn hello(&self, last_epoch: u64, mark_ms: i64) -> Hello {
        let boot_id = self.host.boot_id().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the boot id");
            String::new()
        });
        Hello {
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
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            last_epoch,
            release_floor: 0,
            server_time_mark_ms: mark_ms,
        }
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
                .map_err(|e| error_chain(&e))?;
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

async fn send(conn: &Option<Conn>, msg: node_message::Msg) {
    if let Some(c) = conn {
        // A failed send means the stream is gone; its end arrives as an event.
        let _ = c.tx.send(NodeMessage { msg: Some(msg) }).await;
    }
}

/// Every message of an error's source chain, joined: transport errors bury
/// the useful part (refused, pin mismatch) several sources deep.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !parts.iter().any(|p| p.contains(&m)) {
            parts.push(m);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// Opens what `bcd node` needs from the data directory.
pub fn open(
    dir: &std::path::Path,
    host: Arc<dyn Host>,
    seed: u64,
    stats: Option<Arc<Stats>>,
) -> anyhow::Result<Agent> {
    let identity = Identity::load(dir)?;
    let (journal, opened) = Journal::open(&dir.join(crate::identity::JOURNAL))
        .context("the journal cannot be opened")?;
    if let crate::journal::Opened::Recreated { corrupt } = &opened {
        warn!(aside = %corrupt.display(), "started a new journal; the old one did not open");
    }
    Ok(Agent {
        identity,
        host,
        journal,
        incarnation_id: crate::journal::new_id(),
        config: SessionConfig::default(),
        seed,
        stats,
    })
}
