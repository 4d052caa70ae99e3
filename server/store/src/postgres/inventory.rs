//! Inventory sections.

use super::bindings::fleet_event;
use super::nodes::valid_certs;
use super::{Tx, execute, now, query_opt};
use crate::bindings::VerifySignature;
use crate::error::StoreError;
use crate::inventory::{FORGED, InventoryInput, InventoryRow, host_macs};
use crate::nodes::{Signed, judge_signed};
use crate::specs::FactApplied;

/// Stores a section the node signed (a forgery is recorded) if it names
/// `epoch` and that is the node's session epoch; the session row is held
/// `FOR SHARE` so a Hello cannot bump the epoch meanwhile.
pub(super) async fn put(
    tx: &Tx<'_>,
    node_id: &str,
    epoch: u64,
    signed: &Signed<InventoryInput>,
    verify: VerifySignature,
) -> Result<FactApplied, StoreError> {
    let now = now(tx).await?;
    let certs = valid_certs(tx, node_id, now).await?;
    let section = match judge_signed(node_id, signed, &certs, verify) {
        Ok(s) => s,
        Err(reason) => {
            let detail = match &signed.fact {
                Some(s) => format!("section {}: {reason}", s.section),
                None => reason,
            };
            fleet_event(tx, now, FORGED, node_id, &detail).await?;
            return Ok(FactApplied::Forged(detail));
        }
    };
    let current: Option<i64> = query_opt(
        tx,
        "SELECT epoch FROM node_sessions WHERE node_id = $1 FOR SHARE",
        &[&node_id],
    )
    .await?
    .map(|r| r.get(0));
    // Sent under this session's epoch, and this session is the current one.
    if section.epoch != epoch
        || !current.is_some_and(|cur| bcd_core::epoch::write_applies(cur as u64, epoch))
    {
        return Ok(FactApplied::Stale);
    }
    execute(
        tx,
        "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (node_id, section) DO UPDATE SET
             sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at",
        &[
            &node_id,
            &section.section,
            &section.sha256,
            &section.body,
            &now,
        ],
    )
    .await?;
    if let Some(macs) = host_macs(&section.section, &section.body) {
        super::tokens::record_macs(tx, node_id, &macs, now).await?;
    }
    Ok(FactApplied::Applied)
}

pub(super) async fn get(
    tx: &Tx<'_>,
    node_id: &str,
    section: &str,
) -> Result<Option<InventoryRow>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT sha256, COALESCE(body, ''::bytea), updated_at FROM inventory
             WHERE node_id = $1 AND section = $2",
        &[&node_id, &section],
    )
    .await?
    .map(|r| InventoryRow {
        sha256: r.get(0),
        body: r.get(1),
        updated_at_ms: r.get(2),
    }))
}
