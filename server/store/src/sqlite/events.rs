//! Node events.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::StoreError;
use crate::events::{
    EVENTS_KEPT_PER_NODE, EventInput, EventKey, EventRow, SECURITY_EVENTS_KEPT_MS, SecurityEvent,
    is_security,
};

pub(super) fn put(
    c: &Connection,
    node_id: &str,
    journal_id: &str,
    events: &[EventInput],
) -> Result<u64, StoreError> {
    let mut up_to = 0;
    {
        // Security events also where a gateway cannot delete them.
        let mut tables = [
            c.prepare_cached(
                "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, compute_now() - ?6)
                 ON CONFLICT DO NOTHING",
            )?,
            c.prepare_cached(
                "INSERT INTO node_security_events
                     (node_id, journal_id, event_id, kind, body, body_sha256, at)
                 VALUES (?1, ?2, ?3, ?4, ?5, sha256_hex(?5), compute_now() - ?6)
                 ON CONFLICT DO NOTHING",
            )?,
        ];
        for e in events {
            let into = if is_security(&e.kind) { 2 } else { 1 };
            for q in tables.iter_mut().take(into) {
                q.execute(params![
                    node_id,
                    journal_id,
                    e.id as i64,
                    e.kind,
                    e.body,
                    e.age_ms.min(i64::MAX as u64) as i64
                ])?;
            }
            up_to = up_to.max(e.id);
        }
    }
    c.prepare_cached(
        "DELETE FROM node_events WHERE node_id = ?1 AND rowid IN (
             SELECT rowid FROM node_events WHERE node_id = ?1
             ORDER BY at DESC, event_id DESC LIMIT -1 OFFSET ?2)",
    )?
    .execute(params![node_id, EVENTS_KEPT_PER_NODE])?;
    Ok(up_to)
}

pub(super) fn list(c: &Connection, node_id: &str) -> Result<Vec<EventRow>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT journal_id, event_id, kind, body, at FROM node_events WHERE node_id = ?1
             ORDER BY at, event_id",
        )?
        .query_map([node_id], |r| {
            Ok(EventRow {
                journal_id: r.get(0)?,
                event_id: r.get::<_, i64>(1)? as u64,
                kind: r.get(2)?,
                body: r.get(3)?,
                at_ms: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn receipts(
    c: &Connection,
    node_id: &str,
    journal_id: &str,
    keys: &[EventKey],
) -> Result<Vec<(EventKey, Vec<u8>)>, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT receipt FROM node_security_events
         WHERE node_id = ?1 AND journal_id = ?2 AND event_id = ?3 AND kind = ?4
           AND body_sha256 = ?5 AND length(receipt) > 0",
    )?;
    let mut out = Vec::new();
    for k in keys {
        if let Some(r) = st
            .query_row(
                params![node_id, journal_id, k.id as i64, k.kind, k.body_sha256],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .optional()?
        {
            out.push((k.clone(), r));
        }
    }
    Ok(out)
}

pub(super) fn unreceipted(c: &Connection, limit: u32) -> Result<Vec<SecurityEvent>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT node_id, journal_id, event_id, kind, body FROM node_security_events
         WHERE receipt IS NULL ORDER BY at LIMIT ?1",
    )?
    .query_map([limit], |r| {
        Ok(SecurityEvent {
            node_id: r.get(0)?,
            journal_id: r.get(1)?,
            event_id: r.get::<_, i64>(2)? as u64,
            kind: r.get(3)?,
            body: r.get(4)?,
        })
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn put_receipt(
    c: &Connection,
    e: &SecurityEvent,
    receipt: &[u8],
) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE node_security_events SET receipt = ?4, receipted_at = compute_now()
         WHERE node_id = ?1 AND journal_id = ?2 AND event_id = ?3 AND kind = ?5
           AND body_sha256 = sha256_hex(?6) AND receipt IS NULL",
    )?
    .execute(params![
        e.node_id,
        e.journal_id,
        e.event_id as i64,
        receipt,
        e.kind,
        e.body
    ])?;
    c.prepare_cached(
        "DELETE FROM node_security_events
         WHERE node_id = ?1 AND receipted_at < compute_now() - ?2",
    )?
    .execute(params![e.node_id, SECURITY_EVENTS_KEPT_MS])?;
    Ok(())
}
