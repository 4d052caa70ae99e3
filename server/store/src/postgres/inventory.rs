//! Inventory sections.

use super::{Tx, execute, query_opt};
use crate::error::StoreError;
use crate::inventory::InventoryRow;

/// Stores a section if `epoch` is the node's session epoch; the session
/// row is held `FOR SHARE` so a Hello cannot bump the epoch meanwhile.
pub(super) async fn put(
    tx: &Tx<'_>,
    node_id: &str,
    epoch: u64,
    section: &str,
    sha256: &str,
    body: &[u8],
) -> Result<bool, StoreError> {
    let current: Option<i64> = query_opt(
        tx,
        "SELECT epoch FROM node_sessions WHERE node_id = $1 FOR SHARE",
        &[&node_id],
    )
    .await?
    .map(|r| r.get(0));
    if !current.is_some_and(|cur| bcd_core::epoch::write_applies(cur as u64, epoch)) {
        return Ok(false);
    }
    execute(
        tx,
        "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
         VALUES ($1, $2, $3, $4, compute_now())
         ON CONFLICT (node_id, section) DO UPDATE SET
             sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at",
        &[&node_id, &section, &sha256, &body],
    )
    .await?;
    Ok(true)
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
