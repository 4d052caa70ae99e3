//! Node events.

use super::{Tx, execute, query};
use crate::error::StoreError;
use crate::events::{
    EVENTS_KEPT_PER_NODE, EventInput, EventKey, EventRow, SECURITY_EVENTS_KEPT_MS, SecurityEvent,
    is_security,
};

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
    if events.iter().any(|e| is_security(&e.kind)) {
        execute(
            tx,
            "INSERT INTO node_security_events (node_id, journal_id, event_id, kind, body, at)
             SELECT $1, $2, e.id, e.kind, e.body, compute_now() - e.age
             FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::bigint[]) AS e(id, kind, body, age)
             WHERE e.kind LIKE 'security.%'
             ON CONFLICT DO NOTHING",
            &[&node_id, &journal_id, &ids, &kinds, &bodies, &ages],
        )
        .await?;
    }
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

pub(super) async fn receipts(
    tx: &Tx<'_>,
    node_id: &str,
    journal_id: &str,
    keys: &[EventKey],
) -> Result<Vec<(EventKey, Vec<u8>)>, StoreError> {
    let ids: Vec<i64> = keys.iter().map(|k| k.id as i64).collect();
    let kinds: Vec<&str> = keys.iter().map(|k| k.kind.as_str()).collect();
    let digests: Vec<&str> = keys.iter().map(|k| k.body_sha256.as_str()).collect();
    Ok(query(
        tx,
        "SELECT e.event_id, e.kind, e.body_sha256, e.receipt FROM node_security_events e
         JOIN unnest($3::bigint[], $4::text[], $5::text[]) AS k(id, kind, sha)
           ON e.event_id = k.id AND e.kind = k.kind AND e.body_sha256 = k.sha
         WHERE e.node_id = $1 AND e.journal_id = $2 AND length(e.receipt) > 0",
        &[&node_id, &journal_id, &ids, &kinds, &digests],
    )
    .await?
    .iter()
    .map(|r| {
        (
            EventKey {
                id: r.get::<_, i64>(0) as u64,
                kind: r.get(1),
                body_sha256: r.get(2),
            },
            r.get(3),
        )
    })
    .collect())
}

pub(super) async fn unreceipted(tx: &Tx<'_>, limit: u32) -> Result<Vec<SecurityEvent>, StoreError> {
    Ok(query(
        tx,
        "SELECT node_id, journal_id, event_id, kind, body FROM node_security_events
         WHERE receipt IS NULL ORDER BY at LIMIT $1",
        &[&i64::from(limit)],
    )
    .await?
    .iter()
    .map(|r| SecurityEvent {
        node_id: r.get(0),
        journal_id: r.get(1),
        event_id: r.get::<_, i64>(2) as u64,
        kind: r.get(3),
        body: r.get(4),
    })
    .collect())
}

pub(super) async fn put_receipt(
    tx: &Tx<'_>,
    e: &SecurityEvent,
    receipt: &[u8],
) -> Result<(), StoreError> {
    execute(
        tx,
        "UPDATE node_security_events SET receipt = $4, receipted_at = compute_now()
         WHERE node_id = $1 AND journal_id = $2 AND event_id = $3 AND kind = $5
           AND body_sha256 = encode(sha256($6), 'hex') AND receipt IS NULL",
        &[
            &e.node_id,
            &e.journal_id,
            &(e.event_id as i64),
            &receipt,
            &e.kind,
            &e.body,
        ],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM node_security_events
         WHERE node_id = $1 AND receipted_at < compute_now() - $2",
        &[&e.node_id, &SECURITY_EVENTS_KEPT_MS],
    )
    .await?;
    Ok(())
}
