//! Inventory sections.

use rusqlite::{Connection, OptionalExtension, params};

use super::bindings::fleet_event;
use super::nodes::valid_certs;
use super::{Kept, now};
use crate::bindings::VerifySignature;
use crate::error::StoreError;
use crate::inventory::{FORGED, InventoryInput, InventoryRow, host_macs};
use crate::nodes::{Signed, judge_signed};
use crate::specs::FactApplied;

pub(super) fn put(
    c: &Connection,
    node_id: &str,
    epoch: u64,
    signed: &Signed<InventoryInput>,
    verify: VerifySignature,
) -> Result<FactApplied, StoreError> {
    let now = now(c)?;
    let certs = valid_certs(c, node_id, now)?;
    let section = match judge_signed(node_id, signed, &certs, verify) {
        Ok(s) => s,
        Err(reason) => {
            let detail = match &signed.fact {
                Some(s) => format!("section {}: {reason}", s.section),
                None => reason,
            };
            fleet_event(c, now, FORGED, node_id, &detail)?;
            return Ok(FactApplied::Forged(detail));
        }
    };
    let current: Option<i64> = c
        .query_row_kept(
            "SELECT epoch FROM node_sessions WHERE node_id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    // Sent under this session's epoch, and this session is the current one.
    if section.epoch != epoch
        || !current.is_some_and(|cur| bcd_core::epoch::write_applies(cur as u64, epoch))
    {
        return Ok(FactApplied::Stale);
    }
    c.execute_kept(
        "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (node_id, section) DO UPDATE SET
             sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at",
        params![node_id, section.section, section.sha256, section.body, now],
    )?;
    if let Some(macs) = host_macs(&section.section, &section.body) {
        super::tokens::record_macs(c, node_id, &macs, now)?;
    }
    Ok(FactApplied::Applied)
}

pub(super) fn get(
    c: &Connection,
    node_id: &str,
    section: &str,
) -> Result<Option<InventoryRow>, StoreError> {
    Ok(c.query_row_kept(
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
