//! Command results: journaled (fsynced) first, then sent, and sent again
//! after every Welcome until the server acknowledges them.

use bcd_core::command::{Journaled, Kind};
use bcd_proto::v1::{self, node_message};
use prost::Message;
use tracing::{info, warn};

use super::Agent;
use super::conn::{Conn, send};
use crate::effects::Effect;
use crate::failpoints::Point;

impl Agent {
    /// Journals a command's result (sent now by [`Agent::finish`], or after
    /// the next Welcome).
    pub(super) fn journal_result(
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
            boot_id: self.machine.host.boot_id().unwrap_or_default(),
        };
        self.journal
            .finish(id, &result.encode_to_vec())
            .map_err(|e| format!("journal: {e}"))?;
        info!(cmd = %id, outcome = %result.outcome, "finished");
        self.finished_event(&result);
        Ok(Some((result, Kind::parse(&entry.kind))))
    }

    /// Journals a result for a command the journal holds as accepted or
    /// running (a lost journal holds nothing: the server settles it as
    /// journal-lost).
    pub(super) fn journal_result_if_running(
        &mut self,
        id: &str,
        effect: Effect,
    ) -> Result<(), String> {
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
    pub(super) async fn finish(
        &mut self,
        conn: &Conn,
        id: &str,
        effect: Effect,
    ) -> Result<(), String> {
        let Some((result, kind)) = self.journal_result(id, effect)? else {
            return Ok(());
        };
        self.failpoints.at(Point::AfterResult);
        if kind == Some(Kind::InventoryRefresh) {
            self.reports.forget_inventory();
            self.send_inventory(conn, None).await;
        }
        send(conn, node_message::Msg::CommandResult(result)).await;
        Ok(())
    }

    /// Results the server has not acknowledged, in sequence order.
    pub(super) async fn resend_results(&mut self, conn: &Conn) -> Result<(), String> {
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
}
