//! Node events.

use rusqlite::{Connection, params};

use crate::error::StoreError;
use crate::events::{EVENTS_KEPT_PER_NODE, EventInput, EventRow};

pub(super) fn put(
    c: &Connection,
    node_id: &str,
    journal_id: &str,
    events: &[EventInput],
) -> Result<u64, StoreError> {
    let mut up_to = 0;
    {
        let mut q = c.prepare_cached(
            "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
             VALUES (?1, ?2, ?3, ?4, ?5, compute_now() - ?6)
             ON CONFLICT DO NOTHING",
        )?;
        for e in events {
            q.execute(params![
                node_id,
                journal_id,
                e.id as i64,
                e.kind,
                e.body,
                e.age_ms.min(i64::MAX as u64) as i64
            ])?;
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
