//! Attested bindings and fleet events.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, json_col, now, to_json};
use crate::bindings::{
    ACTIVE, BindingInput, BindingOutcome, BindingRow, LOST, REJECTED, Verdict, VerifySignature,
    judge, replayed,
};
use crate::error::StoreError;

/// Records a fleet event about a node.
pub(super) fn fleet_event(
    c: &Connection,
    at: i64,
    kind: &str,
    node_id: &str,
    detail: &str,
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO fleet_events (at, kind, node_id, detail) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![at, kind, node_id, detail])?;
    Ok(())
}

pub(super) fn record(
    c: &Connection,
    b: &BindingInput,
    verify: VerifySignature,
) -> Result<BindingOutcome, StoreError> {
    let now = now(c)?;
    let node = &b.session_node;
    // The session node's current certificate: the only key that binds.
    let cert: Option<Vec<u8>> = c
        .prepare_cached(
            "SELECT der FROM node_certs WHERE node_id = ?1 AND revoked_at IS NULL
             AND not_after >= ?2 AND der IS NOT NULL ORDER BY not_after DESC LIMIT 1",
        )?
        .query_row(params![node, now], |r| r.get(0))
        .optional()?;
    let existing: Option<String> = match &b.report {
        Some(r) => c
            .prepare_cached("SELECT state FROM bindings WHERE node_id = ?1 AND allocation_id = ?2")?
            .query_row(params![node, r.allocation_id], |row| row.get(0))
            .optional()?,
        None => None,
    };
    let report = match judge(b, cert.as_deref(), verify, existing.as_deref()) {
        Verdict::Reject(reason) => {
            fleet_event(c, now, REJECTED, node, &reason)?;
            return Ok(BindingOutcome::Rejected(reason));
        }
        Verdict::MarkLost(reason) => {
            fleet_event(c, now, REJECTED, node, &reason)?;
            let allocation = b.report.as_ref().map(|r| r.allocation_id.as_str());
            c.execute_kept(
                "UPDATE bindings SET state = 'lost', updated_at = ?3
                 WHERE node_id = ?1 AND allocation_id = ?2",
                params![node, allocation, now],
            )?;
            fleet_event(c, now, LOST, node, &reason)?;
            return Ok(BindingOutcome::MarkedLost(reason));
        }
        Verdict::Verified(report) => report,
    };
    let fresh = c.execute_kept(
        "INSERT INTO binding_nonces (node_id, nonce) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        params![report.node_id, report.nonce],
    )? == 1;
    if !fresh || report.nonce.is_empty() {
        let reason = replayed(report);
        fleet_event(c, now, REJECTED, node, &reason)?;
        return Ok(BindingOutcome::Rejected(reason));
    }
    let mut gpus = report.gpu_uuids.clone();
    gpus.sort();
    c.execute_kept(
        "INSERT INTO bindings (node_id, allocation_id, gpus, state, spec_generation, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (node_id, allocation_id) DO UPDATE SET gpus = excluded.gpus,
             state = excluded.state, spec_generation = excluded.spec_generation,
             updated_at = excluded.updated_at",
        params![
            report.node_id,
            report.allocation_id,
            to_json(&gpus),
            ACTIVE,
            report.spec_generation as i64,
            now
        ],
    )?;
    Ok(BindingOutcome::Accepted)
}

pub(super) fn list(c: &Connection, node_id: &str) -> Result<Vec<BindingRow>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT allocation_id, gpus, state, spec_generation FROM bindings
             WHERE node_id = ?1 ORDER BY allocation_id",
        )?
        .query_map([node_id], |r| {
            Ok(BindingRow {
                allocation_id: r.get(0)?,
                gpus: json_col(r, 1)?,
                state: r.get(2)?,
                spec_generation: r.get::<_, i64>(3)? as u64,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The fleet events `q` selects, oldest first (the newest `limit` of them).
pub(super) fn list_fleet_events(
    c: &Connection,
    q: &crate::events::EventQuery,
) -> Result<Vec<crate::events::FleetEvent>, StoreError> {
    let mut rows = c
        .prepare_cached(
            "SELECT id, at, kind, node_id, detail FROM fleet_events
             WHERE id > ?1 AND at >= ?2 AND (?3 IS NULL OR node_id = ?3)
               AND kind LIKE ?4 ESCAPE '\\'
             ORDER BY CASE WHEN ?1 > 0 THEN id ELSE -id END LIMIT ?5",
        )?
        .query_map(
            params![
                q.after_id,
                q.since_ms,
                q.node_id,
                crate::events::like_pattern(&q.kind),
                q.limit.min(crate::events::EVENTS_READ_AT_MOST)
            ],
            |r| {
                Ok(crate::events::FleetEvent {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    kind: r.get(2)?,
                    node_id: r.get(3)?,
                    detail: r.get(4)?,
                })
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.sort_by_key(|e| e.id);
    Ok(rows)
}

pub(super) fn fleet_events(
    c: &Connection,
    node_id: &str,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT kind, detail FROM fleet_events WHERE node_id = ?1 ORDER BY id DESC LIMIT ?2",
        )?
        .query_map(params![node_id, limit], |r| {
            Ok(format!(
                "{}: {}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}
