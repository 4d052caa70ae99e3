//! Inventory sections.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::StoreError;
use crate::inventory::InventoryRow;

pub(super) fn put(
    c: &Connection,
    node_id: &str,
    epoch: u64,
    section: &str,
    sha256: &str,
    body: &[u8],
) -> Result<bool, StoreError> {
    let current: Option<i64> = c
        .query_row(
            "SELECT epoch FROM node_sessions WHERE node_id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    if !current.is_some_and(|cur| bcd_core::epoch::write_applies(cur as u64, epoch)) {
        return Ok(false);
    }
    c.execute(
        "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
         VALUES (?1, ?2, ?3, ?4, compute_now())
         ON CONFLICT (node_id, section) DO UPDATE SET
             sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at",
        params![node_id, section, sha256, body],
    )?;
    Ok(true)
}

pub(super) fn get(
    c: &Connection,
    node_id: &str,
    section: &str,
) -> Result<Option<InventoryRow>, StoreError> {
    Ok(c.query_row(
        "SELECT sha256, COALESCE(body, X''), updated_at FROM inventory
             WHERE node_id = ?1 AND section = ?2",
        params![node_id, section],
        |r| {
            Ok(InventoryRow {
                sha256: r.get(0)?,
                body: r.get(1)?,
                updated_at_ms: r.get(2)?,
            })
        },
    )
    .optional()?)
}
