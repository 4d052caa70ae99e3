//! The session loop: feeds the session state machine
//! (`bcd_core::Session::handle(now, event)`) with time, stream events and
//! server messages, performs its actions, and multiplexes the rest of the
//! daemon's work around it: results of side effects, staged releases, the
//! convergence and metric timers, certificate renewal and the update
//! watchdog.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bcd_core::command::Journaled;
use bcd_core::report::InventorySection;
use bcd_core::{Action, CloseReason, Event, Renewal, RenewalConfig, ServerClock, Session, Witness};
use bcd_proto::v1::{self, Hello, InventoryHash, ServerMessage, node_message, server_message};
use prost::Message;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::conn::{self, Conn, send};
use super::update::upgrade_sleep;
use super::{Agent, Stopped};
use crate::client::Stream;
use crate::events::{
    ClockAhead, DrainClamped, NodeLoad, RefusalUnconfirmed, RevocationUnconfirmed, WelcomeRefused,
};
use crate::failpoints::Point;
use crate::hw;

/// After a Welcome, how long a gateway has to hand a list newer than the
/// one the node holds before a list that ran out meanwhile (a long outage,
/// a restart) makes the node leave it.
const LIST_GRACE: Duration = Duration::from_secs(5);

/// How often the node journals a load-average metric.
const METRIC_EVERY: Duration = Duration::from_secs(60);

impl Agent {
    pub(super) async fn run_loop(
        &mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Stopped {
        let mut clock = ServerClock::new(self.shared.identity.file.mark(), self.witness());
        // A node that holds a gateway revocation list takes no server time
        // further than its mark allows until a gateway hands one on.
        if self.trust.holds_list() {
            clock.limit_from_mark(self.shared.now());
        }
        let mut session = Session::new(
            self.config,
            self.seed,
            clock,
            self.shared.identity.file.last_epoch,
        );
        let mut dialing: Option<JoinHandle<Result<Stream, String>>> = None;
        let mut conn: Conn = None;
        let mut wanted: Vec<InventorySection> = Vec::new();
        let mut counted = false;
        // When the session now open was established.
        let mut established_at: Option<Instant> = None;
        let (mut done_rx, mut staged_rx) = self
            .commands
            .take_returns()
            .expect("an agent runs once: `run` takes it by value");
        let mut tunnel_ends = self.tunnels.take_ends();
        let mut secrets_done = self.secrets.take_done();
        // Settle an upgrade a previous process started, then what it left
        // in the journal.
        match super::update::settle(&mut self.update, &mut self.shared) {
            Ok(Some(stopped)) => return stopped,
            Ok(None) => {}
            Err(e) => return Stopped::JournalFailed(e),
        }
        match self
            .commands
            .recover(&mut self.shared, &mut self.update, self.desired.spec())
        {
            Ok(Some(stopped)) => return stopped,
            Ok(None) => {}
            Err(e) => return Stopped::JournalFailed(e),
        }
        let mut renewal = Renewal::new(RenewalConfig::default());
        let mut renewing: Option<
            JoinHandle<Result<crate::client::Renewed, crate::client::RenewFailed>>,
        > = None;
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
        // Device changes from the kernel, coalesced (see `uevents`).
        let mut uevents = self.uevents.take();
        let mut debounce = bcd_udev::Debounce::default();
        let mut observed = None;
        loop {
            for event in events.drain(..) {
                let actions = session.handle(self.shared.now(), event);
                for action in actions {
                    match action {
                        Action::Dial => {
                            dialing = Some(conn::spawn_dial(
                                &self.shared.identity,
                                self.footprint.stream_buffer,
                            ))
                        }
                        Action::SendHello {
                            last_epoch,
                            mark_ms,
                        } => {
                            let hello = match self.hello(last_epoch, mark_ms).await {
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
                            established_at = Some(Instant::now());
                            self.link.epoch = Some(epoch);
                            // Written with the mark (the PersistMark that
                            // follows the Welcome).
                            let f = &mut self.shared.identity.file;
                            (f.last_boot_id, f.last_journal_id) = self.link.hello_from.clone();
                            super::observe::established(&self.shared, epoch);
                            if let Some(s) = &self.stats {
                                s.connected.fetch_add(1, Ordering::Relaxed);
                                s.sessions.fetch_add(1, Ordering::Relaxed);
                                s.epoch.store(epoch, Ordering::Relaxed);
                                s.established_ms
                                    .store(bcd_sys::clock::unix_ms(), Ordering::Relaxed);
                                counted = true;
                            }
                            self.desired
                                .send_inventory(&mut self.shared, &conn, &self.link, Some(&wanted))
                                .await;
                            // A new release asks the key holder to confirm
                            // it (sent with the events below).
                            super::update::ask_confirmation(&mut self.update, &self.shared.journal);
                            // Results the server has not acknowledged, in
                            // sequence order, before anything new.
                            if let Err(e) =
                                super::results::resend_results(&mut self.shared, &conn).await
                            {
                                return Stopped::JournalFailed(e);
                            }
                            // A new session: the server acknowledges events
                            // from the start of this journal again, and has
                            // heard none of this process's reports.
                            self.outbox.new_session();
                            self.outbox.flush(&mut self.shared.journal, &conn).await;
                            self.desired.new_session();
                            self.desired
                                .report(&mut self.shared, &conn, &self.link)
                                .await;
                            // Secrets waiting for a session are fetched now,
                            // not at the next pass.
                            self.link.server_now_ms = Some(server_time_ms);
                            if self.secrets.pending(self.desired.spec())
                                && let Err(e) = self.converge(&conn).await
                            {
                                return Stopped::JournalFailed(e);
                            }
                        }
                        Action::Close { reason } => match &reason {
                            CloseReason::StaleEpoch(_) | CloseReason::ClockRefused(_) => self
                                .shared
                                .refused_frame(WelcomeRefused(reason.to_string())),
                            CloseReason::WelcomeTimeout
                            | CloseReason::ServerSilent { .. }
                            | CloseReason::Drain => warn!(%reason, "closing the session"),
                        },
                        Action::Disconnected { retry_in } => {
                            super::observe::disconnected(&self.shared, false);
                            established_at = None;
                            conn = None;
                            dialing = None;
                            self.link.epoch = None;
                            self.uncount(&mut counted);
                            debug!(?retry_in, "disconnected");
                        }
                        Action::PersistMark { mark, epoch } => {
                            self.shared.identity.file.set_mark(&mark);
                            self.shared.identity.file.last_epoch = epoch;
                            if let Err(e) = self.shared.identity.save_state_blocking_pool().await {
                                warn!(error = %bcd_sys::error::chain(&e), "cannot persist the server time mark");
                            }
                        }
                        Action::ServerTimeAhead { said_ms, limit_ms } => {
                            self.shared.refused_frame(ClockAhead {
                                limit_ms,
                                said_ms,
                                why: "the gateway's server time is past what the key holder's \
                                      signed times allow; server time is held to the limit"
                                    .to_string(),
                            });
                            self.outbox.flush(&mut self.shared.journal, &conn).await;
                        }
                        Action::Stop { message } => {
                            self.uncount(&mut counted);
                            self.persist_mark(&session);
                            return Stopped::Refused(message);
                        }
                    }
                }
            }
            super::observe::gauges(&self.shared, &session, &mut observed);
            let now = self.shared.now();
            let sleep_until = session
                .deadline()
                .map(|d| self.shared.origin + d)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let server_now =
                super::renewal::clock(&self.shared.identity, session.clock().now_or_mark(now));
            self.link.server_now_ms = session.clock().server_now(now);
            let secrets_retry = self.secrets.retry_at();
            // When the held gateway revocation list runs out on this
            // gateway, if it can.
            let list_due = established_at.and_then(|at| {
                self.trust
                    .due_in(&self.shared, session.clock().server_now(now))
                    .map(|d| (Instant::now() + d).max(at + LIST_GRACE))
            });
            // None once a renewal failed for good: no attempt is due.
            let renew_due = renewal
                .wait(now, server_now, self.shared.identity.cert_life())
                .map(|wait| Instant::now() + wait);
            tokio::select! {
                _ = tokio::time::sleep_until(renew_due.unwrap_or_else(Instant::now)), if renewing.is_none() && renew_due.is_some() => {
                    let server_now = session.clock().now_or_mark(self.shared.now());
                    renewing = Some(super::renewal::spawn(&self.shared, server_now));
                }
                r = async { renewing.as_mut().expect("guarded").await }, if renewing.is_some() => {
                    renewing = None;
                    let result = r
                        .map_err(|e| crate::client::RenewFailed::from(e.to_string()))
                        .and_then(|r| r);
                    let now = self.shared.now();
                    let server_now = session.clock().now_or_mark(now);
                    self.renewals.finished(&mut self.shared.identity, result, &mut renewal, now, server_now);
                }
                _ = &mut shutdown => {
                    self.uncount(&mut counted);
                    self.persist_mark(&session);
                    return Stopped::Shutdown;
                }
                _ = tokio::time::sleep_until(sleep_until) => events.push(Event::Tick),
                _ = tokio::time::sleep_until(list_due.unwrap_or_else(Instant::now)), if list_due.is_some() => {
                    let server_now = session.clock().server_now(self.shared.now());
                    let gateway = conn.as_ref().map(|c| c.gateway.clone()).unwrap_or_default();
                    if let Err(error) = self.trust.due(&mut self.shared, server_now, &gateway) {
                        events.push(Event::Closed { error });
                    }
                }
                r = async { dialing.as_mut().expect("guarded").await }, if dialing.is_some() => {
                    dialing = None;
                    match r {
                        Ok(Ok(c)) => match self.trust.reached(&mut self.shared, &c.gateway) {
                            Ok(()) => {
                                conn = Some(c);
                                events.push(Event::Connected);
                            }
                            // Dropped unused: nothing was sent to it.
                            Err(error) => events.push(Event::DialFailed { error }),
                        },
                        Ok(Err(error)) => {
                            if let Some(s) = &self.stats {
                                s.dial_failures.fetch_add(1, Ordering::Relaxed);
                            }
                            debug!(%error, "dial failed");
                            super::observe::disconnected(&self.shared, true);
                            events.push(Event::DialFailed { error });
                        }
                        Err(e) => events.push(Event::DialFailed { error: e.to_string() }),
                    }
                }
                _ = journal_idle(self.shared.journal.idle_deadline()) => {
                    self.shared.journal.close_idle(bcd_sys::clock::mono());
                }
                _ = upgrade_sleep(self.update.as_ref().and_then(|u| u.deadline_ms)) => {
                    if super::update::overdue(&mut self.update) {
                        self.uncount(&mut counted);
                        self.persist_mark(&session);
                        return Stopped::Restart;
                    }
                }
                Some(staged) = staged_rx.recv() => {
                    let (id, staged) = *staged;
                    match super::commands::finish_staged(&mut self.shared, &mut self.update, &id, staged) {
                        Ok(stopped) => {
                            self.uncount(&mut counted);
                            self.persist_mark(&session);
                            return stopped;
                        }
                        Err(reason) => {
                            warn!(cmd = %id, %reason, "the command did not go ahead; nothing changed");
                            if let Err(e) = super::results::finish(&mut self.shared, &mut self.desired, &conn, &self.link, &id, crate::effects::Effect::failed(reason)).await {
                                return Stopped::JournalFailed(e);
                            }
                            self.outbox.flush(&mut self.shared.journal, &conn).await;
                        }
                    }
                }
                Some(ended) = async { tunnel_ends.as_mut().expect("guarded").recv().await }, if tunnel_ends.is_some() => {
                    super::observe::tunnel(&self.shared, &ended);
                    self.shared.event(&ended);
                    self.outbox.flush(&mut self.shared.journal, &conn).await;
                }
                Some(batch) = async { secrets_done.as_mut().expect("guarded").recv().await }, if secrets_done.is_some() => {
                    self.secrets.fetched(&mut self.shared, batch);
                    if let Err(e) = self.converge(&conn).await {
                        return Stopped::JournalFailed(e);
                    }
                    self.outbox.flush(&mut self.shared.journal, &conn).await;
                }
                _ = tokio::time::sleep_until(secrets_retry.unwrap_or_else(Instant::now)), if secrets_retry.is_some() => {
                    self.secrets.retry_due();
                    if let Err(e) = self.converge(&conn).await {
                        return Stopped::JournalFailed(e);
                    }
                }
                Some(done) = done_rx.recv() => {
                    let (id, effect) = *done;
                    self.shared.failpoints.at(Point::MidEffect);
                    super::observe::command(&self.shared, &id, &effect);
                    if let Err(e) = super::results::finish(&mut self.shared, &mut self.desired, &conn, &self.link, &id, effect).await {
                        return Stopped::JournalFailed(e);
                    }
                    self.outbox.flush(&mut self.shared.journal, &conn).await;
                }
                _ = converge.tick() => {
                    if let Err(e) = self.converge(&conn).await {
                        return Stopped::JournalFailed(e);
                    }
                    super::observe::inventory(&self.shared, "pass");
                    self.desired.send_inventory(&mut self.shared, &conn, &self.link, None).await;
                }
                n = async { uevents.as_mut().expect("guarded").next().await }, if uevents.is_some() => {
                    super::uevents::on_notice(n, &mut debounce, &mut uevents);
                }
                _ = super::uevents::due(&debounce) => {
                    if debounce.fire(bcd_sys::clock::mono())
                        && let Err(e) = self.reinventory(&conn).await
                    {
                        return Stopped::JournalFailed(e);
                    }
                }
                _ = metrics.tick() => {
                    if let Some(load) = self.shared.machine.host.load_average() {
                        self.shared.event(&NodeLoad {
                            load1: load[0],
                            load15: load[2],
                            load5: load[1],
                        });
                    }
                    self.outbox.flush(&mut self.shared.journal, &conn).await;
                }
                m = async { conn.as_mut().expect("guarded").rx.message().await }, if conn.is_some() => {
                    let event = match m {
                        Ok(Some(msg)) => {
                            let server_now = session.clock().server_now(self.shared.now());
                            match self.on_message(msg, &mut wanted, &conn, server_now).await {
                                Ok(ev) => {
                                    self.outbox.flush(&mut self.shared.journal, &conn).await;
                                    ev
                                }
                                Err(stopped) => {
                                    self.uncount(&mut counted);
                                    self.persist_mark(&session);
                                    return stopped;
                                }
                            }
                        }
                        Ok(None) => Event::Closed { error: "the gateway ended the stream".into() },
                        Err(status) => {
                            let keys = self.shared.worker_keys();
                            let ended = conn::stream_error(&status, self.shared.me(), &keys);
                            if let Some(why) = ended.unconfirmed {
                                self.shared.refused_frame(RefusalUnconfirmed {
                                    code: status.code().to_string(),
                                    message: status.message().to_string(),
                                    why,
                                });
                            }
                            ended.event
                        }
                    };
                    events.push(event);
                }
            }
        }
    }

    /// One pass of the convergers, the secrets' among them. On the agent:
    /// it ties the desired state, the secrets and the session in progress.
    async fn converge(&mut self, conn: &Conn) -> Result<(), String> {
        self.desired
            .converge(&mut self.shared, &mut self.secrets, conn, &self.link)
            .await
    }

    /// A device changed: a new inventory, and the device convergers. On the
    /// agent: it ties the desired state's inventory to its convergers.
    async fn reinventory(&mut self, conn: &Conn) -> Result<(), String> {
        info!("devices changed; taking inventory");
        super::observe::inventory(&self.shared, "uevent");
        self.desired
            .send_inventory(&mut self.shared, conn, &self.link, None)
            .await;
        self.converge(conn).await
    }

    fn uncount(&self, counted: &mut bool) {
        if std::mem::take(counted)
            && let Some(s) = &self.stats
        {
            s.connected.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Persists the server time mark as the session's clock has it now.
    fn persist_mark(&mut self, session: &Session) {
        let mut clock = session.clock().clone();
        clock.advance(self.shared.now());
        let mark = clock.mark();
        if mark != self.shared.identity.file.mark() {
            self.shared.identity.file.set_mark(&mark);
            if let Err(e) = self.shared.identity.save_state() {
                warn!(error = %bcd_sys::error::chain(&e), "cannot persist the server time mark");
            }
        }
    }

    /// The node's own clocks at the origin of the times handed to the core.
    fn witness(&self) -> Witness {
        let since = self.shared.now().as_millis() as i64;
        Witness {
            boot_id: self.shared.machine.host.boot_id().unwrap_or_default(),
            boot_ms: (bcd_sys::clock::boot_ms() as i64).saturating_sub(since),
            wall_ms: bcd_sys::clock::unix_ms().saturating_sub(since),
        }
    }

    async fn on_message(
        &mut self,
        msg: ServerMessage,
        wanted: &mut Vec<InventorySection>,
        conn: &Conn,
        server_now: Option<i64>,
    ) -> Result<Event, Stopped> {
        Ok(match msg.msg {
            Some(server_message::Msg::Welcome(w)) => {
                // A section this node does not know is not sent.
                *wanted = w
                    .inventory_wanted
                    .iter()
                    .filter_map(|&s| bcd_proto::typed::inventory_section(s))
                    .collect();
                let f = &mut self.shared.identity.file;
                f.hello_seq = bcd_proto::hello::raised(f.hello_seq, w.hello_seq_seen);
                Event::Welcome {
                    epoch: w.epoch,
                    server_time_ms: w.server_time_ms,
                    heartbeat_interval: Duration::from_millis(u64::from(w.heartbeat_interval_ms)),
                    first_retry: Duration::from_millis(u64::from(w.first_retry_ms)),
                }
            }
            Some(server_message::Msg::HeartbeatAck(a)) => Event::HeartbeatAck {
                server_time_ms: a.server_time_ms,
                first_retry: Duration::from_millis(u64::from(a.first_retry_ms)),
            },
            Some(server_message::Msg::Revocation(r)) => {
                let keys = self.shared.worker_keys();
                let checked = conn::statement(&r.statement, &keys);
                match Event::revoked(checked.as_ref().ok(), self.shared.me()) {
                    Some(stop) => stop,
                    None => {
                        let why = match checked {
                            Err(why) => why,
                            Ok(s) => format!(
                                "the statement is about node {} ({:?} {:?}), not this node and \
                                 certificate",
                                s.node_id, s.kind, s.serials
                            ),
                        };
                        self.shared.refused_frame(RevocationUnconfirmed {
                            reason: r.reason.clone(),
                            why,
                        });
                        Event::Received
                    }
                }
            }
            Some(server_message::Msg::Drain(d)) => {
                let within = Duration::from_millis(u64::from(d.reconnect_within_ms));
                if within > self.config.max_drain {
                    self.shared.refused_frame(DrainClamped {
                        asked_ms: d.reconnect_within_ms,
                        clamped_ms: self.config.max_drain.as_millis() as u64,
                    });
                }
                Event::Drain { within }
            }
            Some(server_message::Msg::Command(d)) => {
                self.commands
                    .on_dispatch(
                        &mut self.shared,
                        &mut self.update,
                        self.desired.spec(),
                        d,
                        conn,
                        server_now,
                    )
                    .await
                    .map_err(|e| e.unwrap_or_else(Stopped::JournalFailed))?;
                Event::Received
            }
            Some(server_message::Msg::DesiredState(d)) => {
                self.desired
                    .on_desired_state(
                        &mut self.shared,
                        &mut self.secrets,
                        d,
                        conn,
                        &self.link,
                        server_now,
                    )
                    .await
                    .map_err(Stopped::JournalFailed)?;
                Event::Received
            }
            Some(server_message::Msg::EventAck(a)) => {
                // Only what this session sent can be acknowledged.
                self.outbox
                    .acked(&self.shared.journal, a.up_to)
                    .map_err(|e| Stopped::JournalFailed(e.to_string()))?;
                Event::Received
            }
            Some(server_message::Msg::GatewayRevocations(envelope)) => {
                let gateway = conn.as_ref().map(|c| c.gateway.clone()).unwrap_or_default();
                match self
                    .trust
                    .offered(&mut self.shared, envelope, &gateway)
                    .await
                {
                    Ok(Some((issued_ms, ahead))) => Event::SignedTime { issued_ms, ahead },
                    Ok(None) => Event::Received,
                    Err(error) => Event::Closed { error },
                }
            }
            Some(server_message::Msg::EventReceipt(envelope)) => {
                let receipted = super::outbox::on_event_receipt(&mut self.shared, &envelope)
                    .map_err(Stopped::JournalFailed)?;
                let confirmed = match receipted {
                    Some((kind, body_sha256)) => super::update::receipted(
                        &mut self.update,
                        &mut self.shared,
                        &kind,
                        &body_sha256,
                    )
                    .map_err(Stopped::JournalFailed)?,
                    None => None,
                };
                if let Some(id) = confirmed {
                    super::results::send_journaled_result(&mut self.shared, conn, &id)
                        .await
                        .map_err(Stopped::JournalFailed)?;
                }
                Event::Received
            }
            Some(server_message::Msg::ResultReceipt(envelope)) => {
                super::results::on_receipt(&mut self.shared, &envelope)
                    .map_err(Stopped::JournalFailed)?;
                Event::Received
            }
            Some(server_message::Msg::ResultAck(a)) => {
                for id in a.command_ids {
                    self.shared.failpoints.at(Point::BeforeAck);
                    self.shared
                        .journal
                        .mark_acked(&id)
                        .map_err(|e| Stopped::JournalFailed(e.to_string()))?;
                }
                Event::Received
            }
            Some(server_message::Msg::TunnelOpen(open)) => {
                if let Some(refused) = self.tunnels.on_open(
                    &mut self.shared,
                    self.desired.spec(),
                    open,
                    conn,
                    server_now,
                ) {
                    send(conn, node_message::Msg::TunnelRefused(refused)).await;
                }
                self.outbox.flush(&mut self.shared.journal, conn).await;
                Event::Received
            }
            // A message of a later protocol: evidence the server is there.
            None => Event::Received,
        })
    }

    /// The Hello, with its proof signed under the next count (written
    /// first, so a crash never signs a count twice).
    async fn hello(&mut self, last_epoch: u64, mark_ms: i64) -> Result<Hello, String> {
        let boot_id = self.shared.machine.host.boot_id().unwrap_or_else(|e| {
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
            .shared
            .journal
            .open_entries()
            .map_err(|e| format!("journal: {e}"))?
        {
            match e.state {
                Journaled::Done { .. } => journal_done.push(e.id),
                _ => journal_running.push(e.id),
            }
        }
        let mut hello = Hello {
            node_id: self.shared.identity.file.node_id.clone(),
            cert_serial: self.shared.identity.file.cert_serial.clone(),
            incarnation_id: self.incarnation_id.clone(),
            boot_id,
            journal_id: self.shared.journal.journal_id().to_string(),
            inventory_hashes: hw::inventory(self.shared.machine.host.as_ref())
                .into_iter()
                .map(|s| InventoryHash {
                    section: v1::InventoryKind::from(s.name) as i32,
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
                .shared
                .journal
                .applied_generation()
                .map_err(|e| format!("journal: {e}"))?,
            daemon_exits: crate::upgrade::daemon_exits(),
            proof: None,
        };
        // The session this Hello opens, for the identity to keep once a
        // Welcome confirms it (an unproved one too).
        self.link.hello_from = (hello.boot_id.clone(), hello.journal_id.clone());
        let seq = self.shared.identity.file.hello_seq.saturating_add(1);
        self.shared.identity.file.hello_seq = seq;
        // A Hello with no proof (the count not written, the TPM refused to
        // sign) still connects; it changes nothing the fleet believes.
        if let Err(e) = self.shared.identity.save_state_blocking_pool().await {
            warn!(error = %bcd_sys::error::chain(&e), "cannot count the Hello: it goes unproved");
            return Ok(hello);
        }
        // What came before is what the last confirmed session saw; the
        // identity takes this one's once a Welcome confirms it.
        // While this release is an unconfirmed upgrade its floors live in
        // memory only (`Identity::write_version` 1): after a restart they
        // read 0, so it signs no floor it cannot stand by (every command
        // may have started; none is sent again on its word).
        let f = &self.shared.identity.file;
        let command_floor = if self.shared.identity.write_version >= 2 {
            f.replay_floors.command_seq
        } else {
            u64::MAX
        };
        let before = bcd_proto::hello::Before {
            boot_id: f.last_boot_id.clone(),
            journal_id: f.last_journal_id.clone(),
            command_floor,
        };
        let mut proof = bcd_proto::hello::proof_after(&hello, seq, before);
        // A confirmed release (or one outside the A/B slots) says so: no
        // release from before Hello proofs runs under this identity again,
        // so the key holder refuses the node's unproved Hellos from then
        // on. An unconfirmed upgrade says nothing of the kind: it may be
        // swapped back to the release before it.
        proof.release_confirmed = self.shared.identity.write_version >= 2;
        let payload = proof.encode_to_vec();
        hello.proof = self
            .shared
            .sign(&bcd_proto::hello::signed_message(&payload))
            .map(|signature| v1::NodeSigned { payload, signature });
        Ok(hello)
    }
}

/// Until the journal's idle connection is due to close; forever when it is
/// closed or kept open.
async fn journal_idle(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}
