//! Command results: journaled (fsynced) first, then sent, and sent again
//! after every Welcome until the server acknowledges them.
//!
//! The journal keeps a result unsigned; each time it is sent it is signed
//! with the node key the node holds then (`NodeSigned`), so a result
//! journaled before a certificate renewal still verifies after it. A result
//! journaled by an earlier release (its outcome a string) reads back too.

use bcd_core::command::{Journaled, Kind, Outcome};
use bcd_proto::v1::{self, node_message};
use prost::Message;
use tracing::{debug, info, warn};

use super::Shared;
use super::conn::{Conn, Link, send};
use super::state::Desired;
use crate::effects::Effect;
use crate::events::{CommandFinished, ReceiptRefused};
use crate::failpoints::Point;

/// The shape a journaled result had before outcomes were typed: the
/// outcome's name at field 3 (now reserved).
#[derive(Clone, PartialEq, prost::Message)]
struct ResultV0 {
    #[prost(string, tag = "3")]
    outcome: String,
}

/// A journaled result, whichever release journaled it; `None` when the
/// bytes are not a result.
pub(super) fn journaled_result(bytes: &[u8]) -> Option<v1::CommandResult> {
    let mut r = v1::CommandResult::decode(bytes).ok()?;
    if bcd_proto::typed::outcome(r.outcome).is_none() {
        let old = ResultV0::decode(bytes).ok()?;
        r.outcome = v1::Outcome::from(Outcome::parse(&old.outcome)?) as i32;
    }
    Some(r)
}

/// Journals a command's result (sent now by [`finish`], or after
/// the next Welcome).
pub(super) fn journal_result(
    shared: &mut Shared,
    id: &str,
    effect: Effect,
) -> Result<Option<(v1::CommandResult, Option<Kind>)>, String> {
    let Some(entry) = shared
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
        outcome: v1::Outcome::from(effect.outcome) as i32,
        reason: effect.reason,
        exit_code: effect.exit_code.unwrap_or(0),
        has_exit_code: effect.exit_code.is_some(),
        output: effect.output,
        output_truncated: effect.truncated,
        boot_id: shared.machine.host.boot_id().unwrap_or_default(),
        node_id: shared.identity.file.node_id.clone(),
    };
    shared
        .journal
        .finish(id, &result.encode_to_vec())
        .map_err(|e| format!("journal: {e}"))?;
    info!(cmd = %id, outcome = effect.outcome.name(), "finished");
    shared.event(&CommandFinished {
        command_id: result.command_id.clone(),
        outcome: effect.outcome.name().to_string(),
        reason: result.reason.clone(),
    });
    Ok(Some((result, Kind::parse(&entry.kind))))
}

/// Journals a result for a command the journal holds as accepted or
/// running (a lost journal holds nothing: the server settles it as
/// journal-lost).
pub(super) fn journal_result_if_running(
    shared: &mut Shared,
    id: &str,
    effect: Effect,
) -> Result<(), String> {
    match shared
        .journal
        .command(id)
        .map_err(|e| format!("journal: {e}"))?
    {
        Some(e) if matches!(e.state, Journaled::Running { .. } | Journaled::Accepted) => {
            journal_result(shared, id, effect).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// Sends a result, signed now with the node's current key.
pub(super) async fn send_result(shared: &mut Shared, conn: &Conn, mut result: v1::CommandResult) {
    if conn.is_none() {
        return;
    }
    // Results journaled before node ids were in them name this node.
    if result.node_id.is_empty() {
        result.node_id = shared.identity.file.node_id.clone();
    }
    let payload = result.encode_to_vec();
    let Some(signature) = shared.sign(&payload) else {
        warn!(cmd = %result.command_id, "cannot sign the result; it stays journaled");
        return;
    };
    send(
        conn,
        node_message::Msg::CommandResult(v1::NodeSigned { payload, signature }),
    )
    .await;
}

/// Journals a finished side effect's result, then sends it.
pub(super) async fn finish(
    shared: &mut Shared,
    desired: &mut Desired,
    conn: &Conn,
    link: &Link,
    id: &str,
    effect: Effect,
) -> Result<(), String> {
    let Some((result, kind)) = journal_result(shared, id, effect)? else {
        return Ok(());
    };
    shared.failpoints.at(Point::AfterResult);
    if kind == Some(Kind::InventoryRefresh) {
        desired.forget_inventory();
        desired.send_inventory(shared, conn, link, None).await;
    }
    send_result(shared, conn, result).await;
    Ok(())
}

/// Sends the result the journal holds for command `id`, if any.
pub(super) async fn send_journaled_result(
    shared: &mut Shared,
    conn: &Conn,
    id: &str,
) -> Result<(), String> {
    let entry = shared
        .journal
        .command(id)
        .map_err(|e| format!("journal: {e}"))?;
    if let Some(r) = entry
        .and_then(|e| e.result)
        .and_then(|r| journaled_result(&r))
    {
        send_result(shared, conn, r).await;
    }
    Ok(())
}

/// Results the server has not acknowledged, then those a gateway
/// acknowledged that no receipt settled, each in sequence order.
pub(super) async fn resend_results(shared: &mut Shared, conn: &Conn) -> Result<(), String> {
    let journal = |e: rusqlite::Error| format!("journal: {e}");
    let mut entries = shared.journal.open_entries().map_err(journal)?;
    entries.extend(shared.journal.unsettled_results().map_err(journal)?);
    for e in entries {
        if let (Journaled::Done { .. }, Some(r)) = (&e.state, &e.result)
            && let Some(r) = journaled_result(r)
        {
            send_result(shared, conn, r).await;
        }
    }
    Ok(())
}

/// A receipt a gateway handed: the key holder says the store holds a
/// result of this node as the node signed it. It settles the journaled
/// result when it verifies against the worker keys and names this
/// node, the command's sequence and the bytes the node signs for it;
/// anything else is refused and settles nothing.
pub(super) fn on_receipt(shared: &mut Shared, envelope: &[u8]) -> Result<(), String> {
    let receipt = match bcd_proto::receipts::open(envelope, &shared.worker_keys()) {
        Ok(r) => r,
        Err(e) => {
            shared.refused_frame(ReceiptRefused {
                command_id: None,
                why: e.to_string(),
            });
            return Ok(());
        }
    };
    let me = shared.identity.file.node_id.clone();
    let Some(entry) = shared
        .journal
        .command(&receipt.command_id)
        .map_err(|e| format!("journal: {e}"))?
    else {
        // Settled and forgotten already.
        debug!(cmd = %receipt.command_id, "a receipt for a result no longer journaled");
        return Ok(());
    };
    let signed = entry
        .result
        .as_deref()
        .and_then(journaled_result)
        .map(|mut r| {
            if r.node_id.is_empty() {
                r.node_id = me.clone();
            }
            bcd_proto::fingerprint(&r.encode_to_vec())
        });
    // An empty digest: the store's ending is one the control plane
    // decided (a Hello's proof of this node's reboot or lost journal),
    // not these bytes; it is final either way.
    let decided = receipt.result_sha256.is_empty() && signed.is_some();
    if receipt.node_id != me
        || receipt.seq != entry.seq
        || !(decided || signed.as_deref() == Some(receipt.result_sha256.as_str()))
    {
        shared.refused_frame(ReceiptRefused {
            command_id: Some(receipt.command_id.clone()),
            why: "the receipt names another node, sequence or result than this node \
                  journaled"
                .to_string(),
        });
        return Ok(());
    }
    if decided {
        info!(cmd = %receipt.command_id, "the control plane ended the command itself; its result here is settled");
    }
    shared
        .journal
        .settle(&receipt.command_id)
        .map_err(|e| format!("journal: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_journaled_by_an_earlier_release_read_back() {
        // As the release before typed outcomes journaled one: the outcome's
        // name at field 3.
        #[derive(Clone, PartialEq, prost::Message)]
        struct Before {
            #[prost(string, tag = "1")]
            command_id: String,
            #[prost(uint64, tag = "2")]
            seq: u64,
            #[prost(string, tag = "3")]
            outcome: String,
            #[prost(string, tag = "4")]
            reason: String,
        }
        let old = Before {
            command_id: "cmd-1".into(),
            seq: 3,
            outcome: "FAILED".into(),
            reason: "interrupted".into(),
        }
        .encode_to_vec();
        let r = journaled_result(&old).unwrap();
        assert_eq!(
            (r.command_id.as_str(), r.seq, r.reason.as_str()),
            ("cmd-1", 3, "interrupted")
        );
        assert_eq!(r.outcome, v1::Outcome::Failed as i32);
        // Today's.
        let now = v1::CommandResult {
            command_id: "cmd-2".into(),
            outcome: v1::Outcome::Succeeded as i32,
            ..Default::default()
        };
        assert_eq!(journaled_result(&now.encode_to_vec()), Some(now));
        // Neither.
        assert_eq!(journaled_result(b"\x1a\x03BAD"), None);
    }
}
