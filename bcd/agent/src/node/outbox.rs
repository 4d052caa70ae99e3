//! Events: journaled as they happen, sent after each Welcome and as they
//! come, deleted when the gateway acknowledges them, but for security
//! events, deleted only on the key holder's receipt.

use bcd_proto::v1::{self, node_message};
use tracing::{debug, warn};

use super::Shared;
use super::conn::{Conn, send};
use crate::events::ReceiptRefused;
use crate::journal::Journal;

/// Events per batch on the stream.
const EVENT_BATCH: usize = 256;

/// What the session's stream carried of the journal's events: this module
/// alone reads or moves it.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// The highest event id sent in this session.
    sent: u64,
}

/// A security event the key holder's receipt settled: its kind and the
/// SHA-256 of its body, as journaled.
pub(super) type Receipted = (String, String);

/// A receipt a gateway handed for one of this node's security events: the
/// event goes when the receipt verifies against the worker keys and names
/// this node, this journal and the event as journaled; anything else is
/// refused and nothing goes. `Some` with the event's kind and body digest
/// when it went (self-update judges whether it confirms an upgrade).
pub(super) fn on_event_receipt(
    shared: &mut Shared,
    envelope: &[u8],
) -> Result<Option<Receipted>, String> {
    let refused = |why: String| ReceiptRefused {
        command_id: None,
        why,
    };
    let receipt = match bcd_proto::receipts::open_event(envelope, &shared.worker_keys()) {
        Ok(r) => r,
        Err(e) => {
            shared.refused_frame(refused(e.to_string()));
            return Ok(None);
        }
    };
    if receipt.node_id != shared.identity.file.node_id
        || receipt.journal_id != shared.journal.journal_id()
    {
        shared.refused_frame(refused(format!(
            "an event receipt for node {} journal {}, not this node and journal",
            receipt.node_id, receipt.journal_id
        )));
        return Ok(None);
    }
    match shared
        .journal
        .settle_event(receipt.event_id, &receipt.kind, &receipt.body_sha256)
        .map_err(|e| format!("journal: {e}"))?
    {
        Some(true) => return Ok(Some((receipt.kind, receipt.body_sha256))),
        Some(false) => shared.refused_frame(refused(format!(
            "the receipt for event {} names another kind or body than this node journaled",
            receipt.event_id
        ))),
        None => debug!(
            event = receipt.event_id,
            "a receipt for an event no longer journaled"
        ),
    }
    Ok(None)
}

impl Outbox {
    /// A new session: the server acknowledges events from the start of
    /// this journal again.
    pub(super) fn new_session(&mut self) {
        self.sent = 0;
    }

    /// The gateway acknowledged events up to `up_to`: only what this
    /// session sent can be, so no more than that goes.
    pub(super) fn acked(&self, journal: &Journal, up_to: u64) -> rusqlite::Result<()> {
        journal.ack_events(up_to.min(self.sent))
    }

    /// Sends journaled events not yet sent in this session. The journal is
    /// borrowed mutably though only read: a shared `&Journal` held across
    /// the sends would keep the daemon's future from moving between threads
    /// (the journal is not `Sync`).
    pub(super) async fn flush(&mut self, journal: &mut Journal, conn: &Conn) {
        if conn.is_none() {
            return;
        }
        loop {
            let batch = match journal.events_after(self.sent, EVENT_BATCH) {
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
            // Ages, not times: the server dates events on its own clock.
            let now = bcd_sys::clock::unix_ms();
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
            self.sent = last;
            if !full {
                return;
            }
        }
    }
}
