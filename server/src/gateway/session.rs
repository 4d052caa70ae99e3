//! One node's stream, from its Hello to its end.
//!
//! The Hello transaction routes the node here; the Welcome carries the
//! store's time, the epoch and the inventory sections the store lacks.
//! In-flight commands go first, in sequence order, then what is pending,
//! and the node's spec whenever the store has a newer generation. Messages
//! from the node are facts the store records; results, state reports and
//! inventory only as the node's signed facts ([`super::facts`]), verified
//! by the store against the node's certificates. A refusal from the store
//! is answered with the status `api::status` gives it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_store::bindings::{BindingInput, BindingOutcome, BindingReport};
use bc_store::commands::{Dispatch, ResultApplied};
use bc_store::events::EventInput;
use bc_store::sessions::{HelloInput, HelloProved};
use bc_store::specs::FactApplied;
use bc_store::{CommandId, GatewayId, NodeId, Refusal, TxError};
use bcd_core::command::ServerState;
use bcd_core::report::InventorySection;
use bcd_proto::typed;
use bcd_proto::v1::{self, NodeMessage, ServerMessage, Welcome, node_message, server_message};
use prost::Message;
use rustls_pki_types::CertificateDer;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tonic::{Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use super::facts;
use super::lifetime::{End, Heartbeats};
use super::{GatewayState, LocalSession};
use crate::api::status::{Turned, status, turned};

type Out = mpsc::Sender<Result<ServerMessage, Status>>;

fn msg(m: server_message::Msg) -> Result<ServerMessage, Status> {
    Ok(ServerMessage { msg: Some(m) })
}

/// The Hello's proof, when the node signed it with the key of the
/// session's certificate and it says what the Hello says; else why not
/// (the Hello still connects, and changes nothing the fleet believes).
fn proved(h: &v1::Hello, cert_der: &[u8]) -> Result<Option<HelloProved>, String> {
    let Some(signed) = &h.proof else {
        return Ok(None);
    };
    let proof = bcd_proto::hello::decode(&signed.payload).map_err(|e| e.to_string())?;
    bcd_proto::hello::check_matches(&proof, h).map_err(|e| e.to_string())?;
    let message = bcd_proto::hello::signed_message(&signed.payload);
    if !crate::certs::verify_node_signature(cert_der, &message, &signed.signature) {
        return Err("its signature is not by the session certificate's key".into());
    }
    Ok(Some(HelloProved {
        seq: proof.seq,
        command_floor: proof.command_floor,
        release_confirmed: proof.release_confirmed,
        payload: signed.payload.clone(),
        signature: signed.signature.clone(),
    }))
}

fn hello_input(
    h: v1::Hello,
    fingerprint: String,
    gateway_id: &GatewayId,
    proof: Option<HelloProved>,
) -> HelloInput {
    HelloInput {
        node_id: NodeId::from(h.node_id),
        cert_fingerprint: fingerprint,
        cert_serial: h.cert_serial,
        gateway_id: gateway_id.clone(),
        incarnation_id: h.incarnation_id,
        boot_id: h.boot_id,
        journal_id: h.journal_id,
        agent_version: h.agent_version,
        last_epoch: h.last_epoch,
        // Known sections only, once each: a node's rows stay bounded.
        inventory_hashes: InventorySection::ALL
            .into_iter()
            .filter_map(|s| {
                h.inventory_hashes
                    .iter()
                    .find(|x| typed::inventory_section(x.section) == Some(s))
                    .map(|x| (s.name().to_string(), x.sha256.clone()))
            })
            .collect(),
        journal_running: h.journal_running.into_iter().map(CommandId::from).collect(),
        journal_done: h.journal_done.into_iter().map(CommandId::from).collect(),
        daemon_exits: h.daemon_exits,
        proof,
    }
}

/// The `reason` label of a Hello the store turned down.
fn refusal_reason(e: &TxError) -> &'static str {
    match e {
        TxError::Store(_) => "store-unavailable",
        TxError::Refused(r) => match r {
            Refusal::UnknownCertificate => "unknown-certificate",
            Refusal::DeletedNode(..) => "deleted-node",
            Refusal::WrongCertificate(_) => "wrong-certificate",
            Refusal::Revoked(..) => "revoked",
            Refusal::Expired => "certificate-expired",
            Refusal::Fenced(_) => "fenced",
            Refusal::HelloUnproved(..) => "hello-unproved",
            Refusal::BadRequest(_) => "bad-request",
            Refusal::UnknownToken
            | Refusal::ExpiredToken
            | Refusal::UsedToken
            | Refusal::NoSuchNode(_)
            | Refusal::NotFound(_)
            | Refusal::Conflict(_)
            | Refusal::NotReenrolled(..)
            | Refusal::NotEnrolled(_)
            | Refusal::Quarantined(_)
            | Refusal::Internal(_) => "other",
        },
    }
}

/// How long a Hello waits for one of the `max_pending_hellos` permits
/// before it is refused busy (the node backs off and redials).
pub const HELLO_QUEUE_WAIT: Duration = Duration::from_secs(5);

/// Runs one session until it ends.
pub async fn run(
    state: Arc<GatewayState>,
    (fingerprint, cert_der): (String, Arc<CertificateDer<'static>>),
    mut inbound: Streaming<NodeMessage>,
    out: Out,
) {
    let timing = state.timing;
    let hello = match tokio::time::timeout(timing.welcome_timeout, inbound.message()).await {
        Ok(Ok(Some(NodeMessage {
            msg: Some(node_message::Msg::Hello(h)),
        }))) => h,
        Ok(Ok(Some(_))) => {
            state.metrics.hello_refused("not-hello");
            let _ = out
                .send(Err(turned(Turned::Protocol(
                    "the first message must be Hello",
                ))))
                .await;
            return;
        }
        _ => return,
    };
    // The pending-Hello bound counts Hello transactions, taken once the
    // Hello is here: a node slow to send it holds no permit meanwhile.
    // Past the bound a Hello waits its turn (first come, first served) for
    // a while before it is turned away: a node turned away has paid for
    // its TLS handshake and backs off, so a burst just over what the
    // gateway commits a second would come back later and pay again.
    let permit = match tokio::time::timeout(
        HELLO_QUEUE_WAIT.min(timing.welcome_timeout),
        state.hellos.clone().acquire_owned(),
    )
    .await
    {
        Ok(Ok(permit)) => permit,
        _ => {
            state.metrics.hello_refused("too-many-hellos");
            let _ = out.send(Err(turned(Turned::Busy))).await;
            return;
        }
    };
    let node = NodeId::from(&hello.node_id);
    let cert_serial = hello.cert_serial.clone();
    let journal_id = hello.journal_id.clone();
    let applied_generation = hello.applied_generation;
    let proof = proved(&hello, &cert_der).unwrap_or_else(|why| {
        warn!(%node, %why, "the Hello's proof does not hold: it changes nothing the fleet believes");
        None
    });
    let input = hello_input(hello, fingerprint, &state.id, proof);
    let outcome = match state
        .metrics
        .timed("hello", state.store.hello(&input))
        .await
    {
        Ok(o) => {
            state.metrics.hello_welcomed();
            state.hello_committed();
            state.metrics.transition("connected", 1);
            o
        }
        Err(TxError::Refused(Refusal::Fenced(_))) => {
            state.metrics.hello_refused("fenced");
            state.fence("the store says another gateway holds the lease, or it ran out");
            let end = End::Fenced {
                gateway: state.id.to_string(),
            };
            if let Some(s) = end.status() {
                let _ = out.send(Err(s)).await;
            }
            return;
        }
        Err(e) => {
            state.metrics.hello_refused(refusal_reason(&e));
            let _ = out.send(Err(status(e))).await;
            return;
        }
    };
    drop(permit);
    let epoch = outcome.epoch;
    let work_waits = outcome.work_waits(applied_generation);
    let span = info_span!("session", %node, epoch, gateway = %state.id);
    async move {
        let last_heard = Arc::new(Mutex::new(Instant::now()));
        let wake = Arc::new(Notify::new());
        // The spec generation this session has: a full DesiredState goes
        // out whenever the store has a newer one (the work loop compares
        // it with the store's now and then, see feeds::work).
        let sent_generation = Arc::new(std::sync::atomic::AtomicU64::new(applied_generation));
        let (end_tx, mut end_rx) = oneshot::channel::<End>();
        let (tunnel_open, mut tunnel_opens) = mpsc::channel::<v1::TunnelOpen>(8);
        let old = {
            let mut sessions = state.sessions();
            let old = sessions.insert(
                node.clone(),
                LocalSession {
                    epoch,
                    cert_serial: cert_serial.clone(),
                    cert_not_after_ms: outcome.cert_not_after_ms,
                    last_heard: last_heard.clone(),
                    end: Some(end_tx),
                    wake: wake.clone(),
                    sent_generation: sent_generation.clone(),
                    tunnels: super::tunnels::SessionTunnels {
                        open: tunnel_open,
                        closing: tokio::sync::watch::Sender::new(()),
                    },
                },
            );
            state.count_sessions(&sessions);
            old
        };
        if let Some(mut old) = old
            && let Some(tx) = old.end.take()
        {
            let _ = tx.send(End::Superseded);
        }
        info!("session established");
        let welcome = Welcome {
            epoch,
            server_time_ms: outcome.server_time_ms,
            gateway_id: state.id.to_string(),
            heartbeat_interval_ms: timing.heartbeat.as_millis() as u32,
            inventory_wanted: outcome
                .inventory_wanted
                .iter()
                .filter_map(|s| InventorySection::from_name(s))
                .map(|s| v1::InventoryKind::from(s) as i32)
                .collect(),
            first_retry_ms: state
                .first_retry_ms
                .load(std::sync::atomic::Ordering::Relaxed),
            hello_seq_seen: outcome.hello_seq_seen,
        };
        // The newest gateway revocation list, now and whenever a newer one
        // is read.
        let mut revocations = state.gateway_revocations.subscribe();
        let first_list = revocations.borrow_and_update().clone();
        let session = Session {
            state: &state,
            node: &node,
            epoch,
            cert_serial: &cert_serial,
            out: &out,
            journal_id: &journal_id,
            awaiting: Mutex::new(Vec::new()),
            awaiting_events: Mutex::new(Vec::new()),
        };
        if out
            .send(msg(server_message::Msg::Welcome(welcome)))
            .await
            .is_err()
        {
            return session.finish(End::StreamEnded).await;
        }
        if let Some(list) = first_list
            && !session
                .send(server_message::Msg::GatewayRevocations(list.to_vec()))
                .await
        {
            return session.finish(End::StreamEnded).await;
        }
        for f in &outcome.finished {
            info!(cmd = %f.id, state = ServerState::Terminal(f.outcome).name(), reason = %f.reason, "command finished at Hello");
        }
        // In-flight commands first, in sequence order, then what is pending.
        for d in outcome.replay {
            debug!(cmd = %d.id, seq = d.seq, "replaying");
            if !session.send_dispatch(d).await {
                return session.finish(End::StreamEnded).await;
            }
        }
        // What waits for the node goes out at once; else the session
        // waits to be woken (the work loop finds what arrives meanwhile).
        if work_waits {
            wake.notify_one();
        }
        // The gateway's work loop wakes the session when something waits
        // for it (see feeds::work: it also compares the store's spec
        // generations with what each session sent now and then, so a wake
        // cannot be missed for good).
        let mut tick = tokio::time::interval(timing.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut receipts = tokio::time::interval(RECEIPTS_EVERY);
        receipts.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let heartbeats = Heartbeats {
            interval: timing.heartbeat,
            missed: timing.missed_heartbeats,
        };
        let end = loop {
            tokio::select! {
                end = &mut end_rx => break end.unwrap_or(End::Superseded),
                Ok(()) = revocations.changed() => {
                    let list = revocations.borrow_and_update().clone();
                    if let Some(list) = list
                        && !session
                            .send(server_message::Msg::GatewayRevocations(list.to_vec()))
                            .await
                    {
                        break End::StreamEnded;
                    }
                }
                Some(open) = tunnel_opens.recv() => {
                    if !session.send(server_message::Msg::TunnelOpen(open)).await {
                        break End::StreamEnded;
                    }
                }
                _ = receipts.tick(), if session.awaits_receipts() => {
                    if !session.relay_receipts().await {
                        break End::StreamEnded;
                    }
                }
                _ = wake.notified() => {
                    if !session.send_spec(&sent_generation).await
                        || !session.dispatch_pending().await
                    {
                        break End::StreamEnded;
                    }
                }
                m = inbound.message() => match m {
                    Ok(Some(m)) => {
                        *last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                        if !session.handle(&journal_id, m).await {
                            break End::StreamEnded;
                        }
                    }
                    Ok(None) | Err(_) => break End::StreamEnded,
                },
                _ = tick.tick() => {
                    let silent = last_heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                    if let Some(end) = heartbeats.check(silent) {
                        info!(?silent, "missed heartbeats; closing the session");
                        break end;
                    }
                }
            }
        };
        session.finish(end).await
    }
    .instrument(span)
    .await
}

/// What the session's steps share.
struct Session<'a> {
    state: &'a Arc<GatewayState>,
    node: &'a NodeId,
    epoch: u64,
    cert_serial: &'a str,
    out: &'a Out,
    /// The journal the node's Hello named: its security events' receipts
    /// name it.
    journal_id: &'a str,
    /// Results stored in this session whose receipt the node has not been
    /// handed yet, with when they were stored.
    awaiting: Mutex<Vec<(CommandId, Instant)>>,
    /// Likewise the node's security events, by event id.
    /// Security events stored in this session, by id, kind and body.
    awaiting_events: Mutex<Vec<(bc_store::events::EventKey, Instant)>>,
}

/// Results a session waits on receipts for at once; the oldest give way.
const MAX_AWAITING: usize = 1024;

/// How long a session looks for a result's receipt: a result the key
/// holder gives none (no node signed it) is not looked for forever; the
/// node sends it again in its next session.
const AWAIT_RECEIPT: Duration = Duration::from_secs(60);

/// How often a session with results waiting looks for their receipts.
const RECEIPTS_EVERY: Duration = Duration::from_millis(250);

impl Session<'_> {
    /// Ends the session: tells the node, forgets the session here, and
    /// writes the disconnect the end calls for (epoch-fenced).
    async fn finish(&self, end: End) {
        match &end {
            End::Drain { within } => {
                info!(?within, "draining the session");
                let _ = self
                    .out
                    .send(msg(server_message::Msg::Drain(v1::Drain {
                        reconnect_within_ms: within.as_millis().min(u32::MAX as u128) as u32,
                        reason: "the gateway is shutting down".into(),
                    })))
                    .await;
            }
            End::Revoked { reason, statement } => {
                info!(serial = %self.cert_serial, %reason, "certificate revoked; closing the session");
                let _ = self
                    .out
                    .send(msg(server_message::Msg::Revocation(v1::RevocationNotice {
                        reason: reason.clone(),
                        serials: vec![self.cert_serial.to_string()],
                        statement: statement.clone().unwrap_or_default(),
                    })))
                    .await;
            }
            _ => {}
        }
        if let Some(s) = end.status() {
            let _ = self.out.send(Err(s)).await;
        }
        // Queued before the session leaves the map: a shutdown that sees
        // the map empty writes every end queued by then.
        if let Some((cause, age)) = end.disconnect() {
            self.state.ends.push(self.node, self.epoch, age, cause);
        }
        let mut sessions = self.state.sessions();
        if sessions
            .get(self.node)
            .is_some_and(|s| s.epoch == self.epoch)
        {
            sessions.remove(self.node);
        }
        self.state.count_sessions(&sessions);
    }

    fn await_receipt(&self, id: &str) {
        let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
        if awaiting.iter().any(|(a, _)| a == id) {
            return;
        }
        if awaiting.len() >= MAX_AWAITING {
            awaiting.remove(0);
        }
        awaiting.push((CommandId::from(id), Instant::now()));
    }

    fn await_event_receipt(&self, id: bc_store::events::EventKey) {
        let mut awaiting = self
            .awaiting_events
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if awaiting.iter().any(|(a, _)| *a == id) {
            return;
        }
        if awaiting.len() >= MAX_AWAITING {
            awaiting.remove(0);
        }
        awaiting.push((id, Instant::now()));
    }

    fn awaits_receipts(&self) -> bool {
        !self
            .awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            || !self
                .awaiting_events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Hands the node the receipts the key holder signed for results and
    /// security events stored in this session; false when the stream is
    /// unusable.
    async fn relay_receipts(&self) -> bool {
        self.relay_result_receipts().await && self.relay_event_receipts().await
    }

    async fn relay_event_receipts(&self) -> bool {
        let ids: Vec<bc_store::events::EventKey> = {
            let mut awaiting = self
                .awaiting_events
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            awaiting.retain(|(_, at)| at.elapsed() < AWAIT_RECEIPT);
            awaiting.iter().map(|(id, _)| id.clone()).collect()
        };
        if ids.is_empty() {
            return true;
        }
        let found = match self
            .state
            .store
            .event_receipts(self.node, self.journal_id, &ids)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, "cannot read event receipts");
                return true;
            }
        };
        for (id, receipt) in found {
            self.awaiting_events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(a, _)| *a != id);
            if !self.send(server_message::Msg::EventReceipt(receipt)).await {
                return false;
            }
        }
        true
    }

    async fn relay_result_receipts(&self) -> bool {
        let ids: Vec<CommandId> = {
            let mut awaiting = self.awaiting.lock().unwrap_or_else(|p| p.into_inner());
            awaiting.retain(|(_, at)| at.elapsed() < AWAIT_RECEIPT);
            awaiting.iter().map(|(id, _)| id.clone()).collect()
        };
        if ids.is_empty() {
            return true;
        }
        let found = match self.state.store.result_receipts(self.node, &ids).await {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, "cannot read result receipts");
                return true;
            }
        };
        for (id, receipt) in found {
            self.awaiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(a, _)| *a != id);
            // Judged and given none: nothing to wait for.
            if receipt.is_empty() {
                continue;
            }
            if !self.send(server_message::Msg::ResultReceipt(receipt)).await {
                return false;
            }
        }
        true
    }

    async fn send(&self, m: server_message::Msg) -> bool {
        self.out.send(msg(m)).await.is_ok()
    }

    async fn send_dispatch(&self, d: Dispatch) -> bool {
        if let Some(waited) = d.waited_ms {
            self.state.metrics.dispatched_after(waited);
        }
        self.send(server_message::Msg::Command(v1::CommandDispatch {
            command_id: d.id.into_string(),
            seq: d.seq,
            signed: d.signed,
            epoch: self.epoch,
        }))
        .await
    }

    /// Sends the node's spec if the store has a generation newer than the
    /// one the session has; false when the stream is unusable.
    async fn send_spec(&self, sent: &std::sync::atomic::AtomicU64) -> bool {
        use std::sync::atomic::Ordering;
        match self.state.store.signed_spec(self.node).await {
            Ok(Some((generation, signed))) if generation > sent.load(Ordering::SeqCst) => {
                debug!(generation, "sending the desired state");
                sent.store(generation, Ordering::SeqCst);
                self.send(server_message::Msg::DesiredState(v1::DesiredState {
                    generation,
                    signed_spec: signed,
                }))
                .await
            }
            Ok(_) => true,
            Err(e) => {
                warn!(error = %e, "cannot read the node's spec");
                true
            }
        }
    }

    /// Sends what is pending for the node; false when the stream is
    /// unusable.
    async fn dispatch_pending(&self) -> bool {
        let store = &self.state.store;
        match self
            .state
            .metrics
            .timed(
                "take_dispatchable",
                store.take_dispatchable(&self.state.id, self.node, self.epoch),
            )
            .await
        {
            Ok(ds) => {
                for d in ds {
                    debug!(cmd = %d.id, seq = d.seq, "dispatching");
                    if !self.send_dispatch(d).await {
                        return false;
                    }
                }
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot dispatch");
                true
            }
        }
    }

    /// Handles one message; false when the stream is unusable.
    async fn handle(&self, journal_id: &str, m: NodeMessage) -> bool {
        let store = &self.state.store;
        let node = self.node;
        match m.msg {
            Some(node_message::Msg::TunnelRefused(r)) => {
                warn!(sid = %r.sid, reason = %r.reason, "the node refused a tunnel");
                self.state.tunnel_refused(node, r);
                true
            }
            Some(node_message::Msg::Heartbeat(h)) => {
                self.send(server_message::Msg::HeartbeatAck(v1::HeartbeatAck {
                    seq: h.seq,
                    server_time_ms: self.state.clock.now_ms(),
                    first_retry_ms: self
                        .state
                        .first_retry_ms
                        .load(std::sync::atomic::Ordering::Relaxed),
                }))
                .await
            }
            Some(node_message::Msg::Inventory(signed)) => {
                let section = match facts::inventory(signed) {
                    Ok(section) => section,
                    Err(unknown) => {
                        warn!(section = unknown, "inventory section unknown; ignored");
                        return true;
                    }
                };
                if let Some(i) = &section.fact
                    && (bcd_proto::fingerprint(&i.body) != i.sha256 || i.body.len() > 1 << 20)
                {
                    warn!(
                        section = i.section.name(),
                        "inventory section too large or not matching its hash; ignored"
                    );
                    return true;
                }
                match store
                    .put_inventory(
                        node,
                        self.epoch,
                        &section,
                        crate::certs::verify_node_signature,
                    )
                    .await
                {
                    Ok(FactApplied::Applied | FactApplied::Stale) => {}
                    Ok(FactApplied::Forged(reason)) => {
                        warn!(%reason, "{}", bc_store::inventory::FORGED)
                    }
                    Err(e) => warn!(error = %e, "cannot store inventory"),
                }
                true
            }
            Some(node_message::Msg::CommandAck(a)) => {
                let running = match v1::AckState::try_from(a.state) {
                    Ok(v1::AckState::Accepted) => false,
                    Ok(v1::AckState::Running) => true,
                    Ok(v1::AckState::Unspecified) | Err(_) => {
                        warn!(cmd = %a.command_id, state = a.state, "an ack of a state this gateway does not know; ignored");
                        return true;
                    }
                };
                let route = bc_store::commands::Route {
                    gateway_id: self.state.id.clone(),
                    node_id: node.clone(),
                    epoch: self.epoch,
                };
                match store
                    .command_ack(&route, &CommandId::from(&a.command_id), running)
                    .await
                {
                    Ok(true) => {
                        debug!(cmd = %a.command_id, running, "command acknowledged")
                    }
                    Ok(false) => {
                        debug!(cmd = %a.command_id, "ack for a command not in flight on this session (finished, unknown, moved on, or already further)")
                    }
                    Err(e) => warn!(error = %e, "cannot record a command ack"),
                }
                true
            }
            Some(node_message::Msg::CommandResult(signed)) => {
                let r = facts::result(signed);
                let id = r
                    .fact
                    .as_ref()
                    .map(|f| f.command_id.clone())
                    .unwrap_or_default();
                match self
                    .state
                    .metrics
                    .timed(
                        "command_result",
                        store.command_result(node, &r, crate::certs::verify_node_signature),
                    )
                    .await
                {
                    Ok(ResultApplied::Forged(reason)) => {
                        // Not the node's: nothing to acknowledge.
                        warn!(%reason, "{}", bc_store::commands::FORGED);
                        true
                    }
                    Ok(applied) => {
                        match applied {
                            ResultApplied::Applied => info!(cmd = %id, "command finished"),
                            ResultApplied::Duplicate => {
                                debug!(cmd = %id, "duplicate result; the first one stands")
                            }
                            ResultApplied::Unknown => {
                                // Kept as signed, for the key holder to
                                // receipt: the node then forgets it.
                                let unknown = bc_store::commands::UnknownResult {
                                    node_id: node.clone(),
                                    command_id: id.clone(),
                                    payload: r.payload.clone(),
                                    signature: r.signature.clone(),
                                };
                                match store.put_unknown_result(&unknown).await {
                                    Ok(true) => {
                                        warn!(cmd = %id, "result for a command this server does not know; kept for the key holder's receipt");
                                        self.await_receipt(&id);
                                    }
                                    Ok(false) => warn!(
                                        cmd = %id,
                                        "result for a command this server does not know, past what is kept for the node; acknowledged and dropped"
                                    ),
                                    Err(e) => {
                                        warn!(cmd = %id, error = %e, "cannot keep a result for an unknown command")
                                    }
                                }
                            }
                            ResultApplied::Forged(_) => unreachable!("handled above"),
                        }
                        // The key holder's receipt follows once it has
                        // judged the stored result.
                        if matches!(applied, ResultApplied::Applied | ResultApplied::Duplicate) {
                            self.await_receipt(&id);
                        }
                        self.send(server_message::Msg::ResultAck(v1::ResultAck {
                            command_ids: vec![id.into_string()],
                        }))
                        .await
                    }
                    // Not acknowledged: the node keeps it and sends it again.
                    Err(e) => {
                        warn!(error = %e, "cannot record a result");
                        true
                    }
                }
            }
            Some(node_message::Msg::Events(batch)) => {
                // Oversized events are acknowledged and dropped, so the node
                // does not send them forever.
                let max_id = batch.events.iter().map(|e| e.id).max().unwrap_or(0);
                let events: Vec<EventInput> = batch
                    .events
                    .into_iter()
                    .filter(|e| e.kind.len() <= 128 && e.body.len() <= 64 << 10)
                    .map(|e| EventInput {
                        id: e.id,
                        kind: e.kind,
                        body: e.body,
                        age_ms: e.age_ms,
                    })
                    .collect();
                let security: Vec<bc_store::events::EventKey> = events
                    .iter()
                    .filter(|e| bc_store::events::is_security(&e.kind))
                    .map(bc_store::events::EventKey::of)
                    .collect();
                match store.put_events(node, journal_id, &events).await {
                    Ok(_) => {
                        // Kept where no gateway deletes them; the key
                        // holder's receipts follow.
                        for id in security {
                            self.await_event_receipt(id);
                        }
                        self.send(server_message::Msg::EventAck(v1::EventAck {
                            up_to: max_id,
                        }))
                        .await
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot store events");
                        true
                    }
                }
            }
            Some(node_message::Msg::AllocationBound(b)) => {
                let report = v1::BindingPayload::decode(b.payload.as_slice())
                    .ok()
                    .map(|p| BindingReport {
                        node_id: NodeId::from(p.node_id),
                        allocation_id: p.allocation_id,
                        gpu_uuids: p.gpu_uuids,
                        spec_generation: p.spec_generation,
                        nonce: p.nonce,
                    });
                let input = BindingInput {
                    session_node: node.clone(),
                    report,
                    payload: b.payload,
                    signature: b.signature,
                };
                match store
                    .record_binding(&input, crate::certs::verify_node_signature)
                    .await
                {
                    Ok(BindingOutcome::Accepted) => debug!("binding accepted"),
                    Ok(BindingOutcome::Rejected(reason)) => {
                        warn!(%reason, "reservation.binding-rejected")
                    }
                    Ok(BindingOutcome::MarkedLost(reason)) => {
                        warn!(%reason, "forged re-report of an active binding: marked lost")
                    }
                    Err(e) => warn!(error = %e, "cannot record a binding"),
                }
                true
            }
            Some(node_message::Msg::StateReport(signed)) => {
                let report = facts::state_report(signed);
                match store
                    .put_state_report(node, &report, crate::certs::verify_node_signature)
                    .await
                {
                    Ok(FactApplied::Applied | FactApplied::Stale) => {}
                    Ok(FactApplied::Forged(reason)) => {
                        warn!(%reason, "{}", bc_store::specs::FORGED)
                    }
                    Err(e) => warn!(error = %e, "cannot record a state report"),
                }
                // Commands waiting on this generation may go now.
                self.dispatch_pending().await
            }
            Some(node_message::Msg::Hello(_)) => {
                let _ = self
                    .out
                    .send(Err(turned(Turned::Protocol(
                        "Hello is only valid as the first message",
                    ))))
                    .await;
                false
            }
            // A message this gateway does not know (a later protocol
            // version): ignored.
            None => true,
        }
    }
}

#[cfg(test)]
mod hello_tests {
    use super::*;

    #[test]
    fn a_hello_names_known_inventory_sections_only_once_each() {
        let hash = |section: i32, sha: &str| v1::InventoryHash {
            section,
            sha256: sha.into(),
        };
        let h = v1::Hello {
            node_id: "nd-1".into(),
            inventory_hashes: vec![
                hash(v1::InventoryKind::Gpus as i32, "a"),
                hash(v1::InventoryKind::Gpus as i32, "b"),
                hash(v1::InventoryKind::Unspecified as i32, "c"),
                hash(99, "d"),
                hash(v1::InventoryKind::Host as i32, "e"),
            ],
            ..Default::default()
        };
        let input = hello_input(h, "fp".into(), &GatewayId::from("gw"), None);
        assert_eq!(
            input.inventory_hashes,
            vec![
                ("host".to_string(), "e".to_string()),
                ("gpus".into(), "a".into())
            ]
        );
    }

    #[test]
    fn a_proof_holds_only_signed_by_the_session_key_of_what_the_hello_says() {
        use rcgen::{CertificateParams, KeyPair};
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::default().self_signed(&key).unwrap();
        let h = v1::Hello {
            node_id: "nd-1".into(),
            cert_serial: "0a".into(),
            boot_id: "boot".into(),
            journal_id: "j".into(),
            ..Default::default()
        };
        let signed = |h: &v1::Hello, key: &KeyPair, seq: u64| {
            let payload = bcd_proto::hello::proof(h, seq).encode_to_vec();
            let m = bcd_proto::hello::signed_message(&payload);
            v1::NodeSigned {
                signature: rcgen::SigningKey::sign(key, &m).unwrap(),
                payload,
            }
        };
        assert_eq!(proved(&h, cert.der()), Ok(None));
        let good = v1::Hello {
            proof: Some(signed(&h, &key, 7)),
            ..h.clone()
        };
        let p = proved(&good, cert.der()).unwrap().unwrap();
        assert_eq!((p.seq, p.release_confirmed), (7, false));
        // What the node signed of its release is what the store is told.
        let mut confirmed = bcd_proto::hello::proof(&h, 8);
        confirmed.release_confirmed = true;
        let payload = confirmed.encode_to_vec();
        let signature =
            rcgen::SigningKey::sign(&key, &bcd_proto::hello::signed_message(&payload)).unwrap();
        let from_confirmed = v1::Hello {
            proof: Some(v1::NodeSigned { payload, signature }),
            ..h.clone()
        };
        let p = proved(&from_confirmed, cert.der()).unwrap().unwrap();
        assert_eq!((p.seq, p.release_confirmed), (8, true));
        // The Hello says another boot than the node signed.
        let moved = v1::Hello {
            boot_id: "other".into(),
            ..good.clone()
        };
        assert!(proved(&moved, cert.der()).unwrap_err().contains("boot"));
        // Signed by a key that is not the session's.
        let other = KeyPair::generate().unwrap();
        let foreign = v1::Hello {
            proof: Some(signed(&h, &other, 7)),
            ..h.clone()
        };
        assert!(
            proved(&foreign, cert.der())
                .unwrap_err()
                .contains("signature")
        );
        // The bare payload signed, not the proof's message.
        let mut bare = signed(&h, &key, 7);
        bare.signature = rcgen::SigningKey::sign(&key, &bare.payload).unwrap();
        let bare = v1::Hello {
            proof: Some(bare),
            ..h
        };
        assert!(proved(&bare, cert.der()).is_err());
    }
}
