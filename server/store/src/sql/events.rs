//! Node events. A batch is one statement on PostgreSQL (its lists bound as
//! arrays) and a statement an event on SQLite; security events also go
//! where a gateway cannot delete them.

use super::{Db, Dialect, List};
use crate::error::StoreError;
use crate::events::{
    EVENTS_KEPT_PER_NODE, EventInput, EventKey, EventRow, SECURITY_EVENTS_KEPT_MS, SecurityEvent,
    is_security,
};
use crate::id::NodeId;

/// An event's age, as the store keeps it.
fn age(e: &EventInput) -> i64 {
    e.age_ms.min(i64::MAX as u64) as i64
}

pub(crate) async fn put(
    db: &impl Db,
    node_id: &NodeId,
    journal_id: &str,
    events: &[EventInput],
) -> Result<u64, StoreError> {
    if events.is_empty() {
        return Ok(0);
    }
    let up_to = events.iter().map(|e| e.id).max().unwrap_or(0);
    match db.dialect() {
        Dialect::Sqlite => {
            for e in events {
                let row: [&dyn super::Param; 6] = [
                    &node_id,
                    &journal_id,
                    &(e.id as i64),
                    &e.kind,
                    &e.body,
                    &age(e),
                ];
                db.execute(
                    "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
                     VALUES ($1, $2, $3, $4, $5, compute_now() - $6)
                     ON CONFLICT DO NOTHING",
                    &row,
                )
                .await?;
                if is_security(&e.kind) {
                    db.execute(
                        "INSERT INTO node_security_events
                             (node_id, journal_id, event_id, kind, body, body_sha256, at)
                         VALUES ($1, $2, $3, $4, $5, sha256_hex($5), compute_now() - $6)
                         ON CONFLICT DO NOTHING",
                        &row,
                    )
                    .await?;
                }
            }
            db.execute(
                "DELETE FROM node_events WHERE node_id = $1 AND rowid IN (
                     SELECT rowid FROM node_events WHERE node_id = $1
                     ORDER BY at DESC, event_id DESC LIMIT -1 OFFSET $2)",
                &[&node_id, &EVENTS_KEPT_PER_NODE],
            )
            .await?;
        }
        Dialect::Postgres => {
            let ids = List(events.iter().map(|e| e.id as i64).collect());
            let kinds = List(events.iter().map(|e| e.kind.as_str()).collect());
            let bodies = List(events.iter().map(|e| e.body.as_slice()).collect());
            let ages = List(events.iter().map(age).collect());
            let batch: [&dyn super::Param; 6] =
                [&node_id, &journal_id, &ids, &kinds, &bodies, &ages];
            // The database turns ages into times.
            db.execute(
                "INSERT INTO node_events (node_id, journal_id, event_id, kind, body, at)
                 SELECT $1, $2, e.id, e.kind, e.body, compute_now() - e.age
                 FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::bigint[])
                     AS e(id, kind, body, age)
                 ON CONFLICT DO NOTHING",
                &batch,
            )
            .await?;
            if events.iter().any(|e| is_security(&e.kind)) {
                // The body's digest is a generated column here.
                db.execute(
                    "INSERT INTO node_security_events (node_id, journal_id, event_id, kind, body, at)
                     SELECT $1, $2, e.id, e.kind, e.body, compute_now() - e.age
                     FROM unnest($3::bigint[], $4::text[], $5::bytea[], $6::bigint[])
                         AS e(id, kind, body, age)
                     WHERE e.kind LIKE 'security.%'
                     ON CONFLICT DO NOTHING",
                    &batch,
                )
                .await?;
            }
            db.execute(
                "DELETE FROM node_events e USING (
                     SELECT journal_id, event_id FROM node_events WHERE node_id = $1
                     ORDER BY at DESC, event_id DESC OFFSET $2) old
                 WHERE e.node_id = $1 AND e.journal_id = old.journal_id
                   AND e.event_id = old.event_id",
                &[&node_id, &EVENTS_KEPT_PER_NODE],
            )
            .await?;
        }
    }
    Ok(up_to)
}

pub(crate) async fn list(db: &impl Db, node_id: &NodeId) -> Result<Vec<EventRow>, StoreError> {
    db.query(
        "SELECT journal_id, event_id, kind, body, at FROM node_events WHERE node_id = $1
         ORDER BY at, event_id",
        &[&node_id],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(EventRow {
            journal_id: r.get(0)?,
            event_id: r.get::<i64>(1)? as u64,
            kind: r.get(2)?,
            body: r.get(3)?,
            at_ms: r.get(4)?,
        })
    })
    .collect()
}

/// The key holder's receipts for `node_id`'s security events of
/// `journal_id` among `keys`: one at most for each.
pub(crate) async fn receipts(
    db: &impl Db,
    node_id: &NodeId,
    journal_id: &str,
    keys: &[EventKey],
) -> Result<Vec<(EventKey, Vec<u8>)>, StoreError> {
    if db.dialect() == Dialect::Postgres {
        // One statement for the keys.
        let ids = List(keys.iter().map(|k| k.id as i64).collect());
        let kinds = List(keys.iter().map(|k| k.kind.as_str()).collect());
        let digests = List(keys.iter().map(|k| k.body_sha256.as_str()).collect());
        return db
            .query(
                "SELECT e.event_id, e.kind, e.body_sha256, e.receipt FROM node_security_events e
                 JOIN unnest($3::bigint[], $4::text[], $5::text[]) AS k(id, kind, sha)
                   ON e.event_id = k.id AND e.kind = k.kind AND e.body_sha256 = k.sha
                 WHERE e.node_id = $1 AND e.journal_id = $2 AND length(e.receipt) > 0",
                &[&node_id, &journal_id, &ids, &kinds, &digests],
            )
            .await?
            .iter()
            .map(|r| {
                Ok((
                    EventKey {
                        id: r.get::<i64>(0)? as u64,
                        kind: r.get(1)?,
                        body_sha256: r.get(2)?,
                    },
                    r.get(3)?,
                ))
            })
            .collect();
    }
    let mut out = Vec::new();
    for k in keys {
        let receipt: Option<Vec<u8>> = db
            .query_opt(
                "SELECT receipt FROM node_security_events
                 WHERE node_id = $1 AND journal_id = $2 AND event_id = $3 AND kind = $4
                   AND body_sha256 = $5 AND length(receipt) > 0",
                &[
                    &node_id,
                    &journal_id,
                    &(k.id as i64),
                    &k.kind,
                    &k.body_sha256,
                ],
            )
            .await?
            .map(|r| r.get(0))
            .transpose()?;
        if let Some(r) = receipt {
            out.push((k.clone(), r));
        }
    }
    Ok(out)
}

pub(crate) async fn unreceipted(
    db: &impl Db,
    limit: u32,
) -> Result<Vec<SecurityEvent>, StoreError> {
    db.query(
        "SELECT node_id, journal_id, event_id, kind, body FROM node_security_events
         WHERE receipt IS NULL ORDER BY at LIMIT $1",
        &[&i64::from(limit)],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(SecurityEvent {
            node_id: r.get(0)?,
            journal_id: r.get(1)?,
            event_id: r.get::<i64>(2)? as u64,
            kind: r.get(3)?,
            body: r.get(4)?,
        })
    })
    .collect()
}

pub(crate) async fn put_receipt(
    db: &impl Db,
    e: &SecurityEvent,
    receipt: &[u8],
) -> Result<(), StoreError> {
    let digest = match db.dialect() {
        Dialect::Sqlite => "sha256_hex($6)",
        Dialect::Postgres => "encode(sha256($6), 'hex')",
    };
    db.execute(
        &format!(
            "UPDATE node_security_events SET receipt = $4, receipted_at = compute_now()
             WHERE node_id = $1 AND journal_id = $2 AND event_id = $3 AND kind = $5
               AND body_sha256 = {digest} AND receipt IS NULL"
        ),
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
    db.execute(
        "DELETE FROM node_security_events
         WHERE node_id = $1 AND receipted_at < compute_now() - $2",
        &[&e.node_id, &SECURITY_EVENTS_KEPT_MS],
    )
    .await?;
    Ok(())
}
