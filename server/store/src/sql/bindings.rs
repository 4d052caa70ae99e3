//! Attested bindings and fleet events.

use super::{Db, to_json};
use crate::bindings::{
    ACTIVE, BindingInput, BindingOutcome, BindingRow, LOST, REJECTED, Verdict, VerifySignature,
    judge, replayed,
};
use crate::error::StoreError;
use crate::id::NodeId;

/// Records a fleet event about a node.
pub(crate) async fn fleet_event(
    db: &impl Db,
    at: i64,
    kind: &str,
    node_id: &NodeId,
    detail: &str,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO fleet_events (at, kind, node_id, detail) VALUES ($1, $2, $3, $4)",
        &[&at, &kind, &node_id, &detail],
    )
    .await?;
    Ok(())
}

/// Publishes a fleet event about a node at the store's now.
pub(crate) async fn publish(
    db: &impl Db,
    kind: &str,
    node_id: &NodeId,
    detail: &str,
) -> Result<(), StoreError> {
    let at = db.now().await?;
    fleet_event(db, at, kind, node_id, detail).await
}

pub(crate) async fn record(
    db: &impl Db,
    b: &BindingInput,
    verify: VerifySignature,
) -> Result<BindingOutcome, StoreError> {
    let now = db.now().await?;
    let node = &b.session_node;
    // The session node's current certificate: the only key that binds.
    let cert: Option<Vec<u8>> = db
        .query_opt(
            "SELECT der FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
         AND not_after >= $2 AND der IS NOT NULL ORDER BY not_after DESC LIMIT 1",
            &[node, &now],
        )
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    let existing: Option<String> = match &b.report {
        Some(r) => db
            .query_opt(
                "SELECT state FROM bindings WHERE node_id = $1 AND allocation_id = $2 FOR UPDATE",
                &[node, &r.allocation_id],
            )
            .await?
            .map(|row| row.get(0))
            .transpose()?,
        None => None,
    };
    let report = match judge(b, cert.as_deref(), verify, existing.as_deref()) {
        Verdict::Reject(reason) => {
            fleet_event(db, now, REJECTED, node, &reason).await?;
            return Ok(BindingOutcome::Rejected(reason));
        }
        Verdict::MarkLost(reason) => {
            fleet_event(db, now, REJECTED, node, &reason).await?;
            let allocation = b.report.as_ref().map(|r| r.allocation_id.as_str());
            db.execute(
                "UPDATE bindings SET state = 'lost', updated_at = $3
                 WHERE node_id = $1 AND allocation_id = $2",
                &[node, &allocation, &now],
            )
            .await?;
            fleet_event(db, now, LOST, node, &reason).await?;
            return Ok(BindingOutcome::MarkedLost(reason));
        }
        Verdict::Verified(report) => report,
    };
    let fresh = db
        .execute(
            "INSERT INTO binding_nonces (node_id, nonce) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&report.node_id, &report.nonce],
        )
        .await?
        == 1;
    if !fresh || report.nonce.is_empty() {
        let reason = replayed(report);
        fleet_event(db, now, REJECTED, node, &reason).await?;
        return Ok(BindingOutcome::Rejected(reason));
    }
    let mut gpus = report.gpu_uuids.clone();
    gpus.sort();
    db.execute(
        "INSERT INTO bindings (node_id, allocation_id, gpus, state, spec_generation, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (node_id, allocation_id) DO UPDATE SET gpus = excluded.gpus,
             state = excluded.state, spec_generation = excluded.spec_generation,
             updated_at = excluded.updated_at",
        &[
            &report.node_id,
            &report.allocation_id,
            &to_json(&gpus),
            &ACTIVE,
            &(report.spec_generation.min(i64::MAX as u64) as i64),
            &now,
        ],
    )
    .await?;
    Ok(BindingOutcome::Accepted)
}

pub(crate) async fn list(db: &impl Db, node_id: &NodeId) -> Result<Vec<BindingRow>, StoreError> {
    let rows = db
        .query(
            "SELECT allocation_id, gpus, state, spec_generation FROM bindings
         WHERE node_id = $1 ORDER BY allocation_id",
            &[&node_id],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(BindingRow {
            allocation_id: r.get(0)?,
            gpus: r.json(1)?,
            state: r.get(2)?,
            spec_generation: r.get::<i64>(3)? as u64,
        });
    }
    Ok(out)
}

/// The fleet events `q` selects, oldest first (the newest `limit` of them).
pub(crate) async fn list_fleet_events(
    db: &impl Db,
    q: &crate::events::EventQuery,
) -> Result<Vec<crate::events::FleetEvent>, StoreError> {
    let limit = i64::from(q.limit.min(crate::events::EVENTS_READ_AT_MOST));
    let mut rows: Vec<crate::events::FleetEvent> = db
        .query(
            "SELECT id, at, kind, node_id, detail FROM fleet_events
         WHERE id > $1 AND at >= $2 AND (CAST($3 AS TEXT) IS NULL OR node_id = $3)
           AND kind LIKE $4 ESCAPE '\\'
         ORDER BY CASE WHEN $1 > 0 THEN id ELSE -id END LIMIT $5",
            &[
                &q.after_id,
                &q.since_ms,
                &q.node_id,
                &crate::events::like_pattern(&q.kind),
                &limit,
            ],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(crate::events::FleetEvent {
                id: r.get(0)?,
                at_ms: r.get(1)?,
                kind: r.get(2)?,
                node_id: r.get(3)?,
                detail: r.get(4)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    rows.sort_by_key(|e| e.id);
    Ok(rows)
}

pub(crate) async fn fleet_events(
    db: &impl Db,
    node_id: &NodeId,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    db.query(
        "SELECT kind, detail FROM fleet_events WHERE node_id = $1 ORDER BY id DESC LIMIT $2",
        &[&node_id, &i64::from(limit)],
    )
    .await?
    .iter()
    .map(|r| Ok(format!("{}: {}", r.get::<String>(0)?, r.get::<String>(1)?)))
    .collect()
}
