//! Events: journaled as they happen, sent after each Welcome and as they
//! come, deleted when the gateway acknowledges them, but for security
//! events, deleted only on the key holder's receipt.

use bcd_core::command::Outcome;
use bcd_proto::v1::{self, node_message};
use tracing::{debug, warn};

use super::Agent;
use super::conn::{Conn, send};
use crate::events::{CommandFinished, ReceiptRefused};

/// Events per batch on the stream.
const EVENT_BATCH: usize = 256;

impl Agent {
    /// A receipt a gateway handed for one of this node's security events:
    /// the event goes when the receipt verifies against the worker keys and
    /// names this node, this journal and the event as journaled; anything
    /// else is refused and nothing goes. `Some` with an upgrade's command
    /// when the receipt confirmed it (its result is journaled, to send).
    pub(super) fn on_event_receipt(&mut self, envelope: &[u8]) -> Result<Option<String>, String> {
        let refused = |why: String| ReceiptRefused {
            command_id: None,
            why,
        };
        let receipt = match bcd_proto::receipts::open_event(envelope, &self.shared.worker_keys()) {
            Ok(r) => r,
            Err(e) => {
                self.shared.refused_frame(refused(e.to_string()));
                return Ok(None);
            }
        };
        if receipt.node_id != self.shared.identity.file.node_id
            || receipt.journal_id != self.shared.journal.journal_id()
        {
            self.shared.refused_frame(refused(format!(
                "an event receipt for node {} journal {}, not this node and journal",
                receipt.node_id, receipt.journal_id
            )));
            return Ok(None);
        }
        match self
            .shared
            .journal
            .settle_event(receipt.event_id, &receipt.kind, &receipt.body_sha256)
            .map_err(|e| format!("journal: {e}"))?
        {
            Some(true) => return self.upgrade_receipted(&receipt.kind, &receipt.body_sha256),
            Some(false) => self.shared.refused_frame(refused(format!(
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

    pub(super) fn finished_event(&mut self, r: &v1::CommandResult, outcome: Outcome) {
        self.shared.event(&CommandFinished {
            command_id: r.command_id.clone(),
            outcome: outcome.name().to_string(),
            reason: r.reason.clone(),
        });
    }

    /// Sends journaled events not yet sent in this session.
    pub(super) async fn flush_events(&mut self, conn: &Conn) {
        if conn.is_none() {
            return;
        }
        loop {
            let batch = match self
                .shared
                .journal
                .events_after(self.sent_events, EVENT_BATCH)
            {
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
            self.sent_events = last;
            if !full {
                return;
            }
        }
    }
}
