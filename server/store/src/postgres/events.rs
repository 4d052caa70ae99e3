//! Node events.

use super::{Tx, execute, query};
use crate::error::StoreError;
use crate::events::{EVENTS_KEPT_PER_NODE, EventInput, EventRow};

pub(super) async fn put(
    tx: &Tx<'_>,
    node_id: &str,
    journal_id: &str,
    events: &[EventInput],
) -> Result<u64, StoreError> {
    let up_to = events.iter().map(|e| e.id).max().unwrap_or(0);
    if events.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = events.iter().map(|e| e.id as i64).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let bodies: Vec<&[u8]> = events.iter().map(|e| e.body.as_slice()).collect();
    let ages: Vec<i64> = events
        .iter()
        .map(|e| e.age_ms.min(i64::MAX as u64) as i64)
        .collect();
    // One statement for the batch; the database turns ages into times.
    execute(
        tx,
        "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
         SELECT $1, $2, e.id, e.kind, e.body, compute_now() - e.age
         FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::bigint[]) AS e(id, kind, body, age)
         ON CONFLICT DO NOTHING",
        &[&node_id, &journal_id, &ids, &kinds, &bodies, &ages],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM node_events e USING (
             SELECT journal_id, event_id FROM node_events WHERE node_id = $1
             ORDER BY at DESC, event_id DESC OFFSET $2) old
         WHERE e.node_id = $1 AND e.journal_id = old.journal_id AND e.event_id = old.event_id",
        &[&node_id, &EVENTS_KEPT_PER_NODE],
    )
    .await?;
    Ok(up_to)
}

pub(super) async fn list(tx: &Tx<'_>, node_id: &str) -> Result<Vec<EventRow>, StoreError> {
    Ok(query(
        tx,
        "SELECT journal_id, event_id, kind, body, at FROM node_events WHERE node_id = $1
         ORDER BY at, event_id",
        &[&node_id],
    )
    .await?
    .iter()
    .map(|r| EventRow {
        journal_id: r.get(0),
        event_id: r.get::<_, i64>(1) as u64,
        kind: r.get(2),
        body: r.get(3),
        at_ms: r.get(4),
    })
    .collect())
}
