//! Attested bindings and fleet events.

use super::{Tx, execute, json_col, now, query, query_opt, to_json};
use crate::bindings::{
    ACTIVE, BindingInput, BindingOutcome, BindingRow, LOST, REJECTED, Verdict, VerifySignature,
    judge, replayed,
};
use crate::error::StoreError;

/// Records a fleet event about a node.
pub(super) async fn fleet_event(
    tx: &Tx<'_>,
    at: i64,
    kind: &str,
    node_id: &str,
    detail: &str,
) -> Result<(), tokio_postgres::Error> {
    execute(
        tx,
        "INSERT INTO fleet_events (at, kind, node_id, detail) VALUES ($1, $2, $3, $4)",
        &[&at, &kind, &node_id, &detail],
    )
    .await?;
    Ok(())
}

pub(super) async fn record(
    tx: &Tx<'_>,
    b: &BindingInput,
    verify: VerifySignature,
) -> Result<BindingOutcome, StoreError> {
    let now = now(tx).await?;
    let node = &b.session_node;
    // The session node's current certificate: the only key that binds.
    let cert: Option<Vec<u8>> = query_opt(
        tx,
        "SELECT der FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
         AND not_after >= $2 AND der IS NOT NULL ORDER BY not_after DESC LIMIT 1",
        &[node, &now],
    )
    .await?
    .map(|r| r.get(0));
    let existing: Option<String> = match &b.report {
        Some(r) => query_opt(
            tx,
            "SELECT state FROM bindings WHERE node_id = $1 AND allocation_id = $2 FOR UPDATE",
            &[node, &r.allocation_id],
        )
        .await?
        .map(|row| row.get(0)),
        None => None,
    };
    let report = match judge(b, cert.as_deref(), verify, existing.as_deref()) {
        Verdict::Reject(reason) => {
            fleet_event(tx, now, REJECTED, node, &reason).await?;
            return Ok(BindingOutcome::Rejected(reason));
        }
        Verdict::MarkLost(reason) => {
            fleet_event(tx, now, REJECTED, node, &reason).await?;
            let allocation = b.report.as_ref().map(|r| r.allocation_id.as_str());
            execute(
                tx,
                "UPDATE bindings SET state = 'lost', updated_at = $3
                 WHERE node_id = $1 AND allocation_id = $2",
                &[node, &allocation, &now],
            )
            .await?;
            fleet_event(tx, now, LOST, node, &reason).await?;
            return Ok(BindingOutcome::MarkedLost(reason));
        }
        Verdict::Verified(report) => report,
    };
    let fresh = execute(
        tx,
        "INSERT INTO binding_nonces (node_id, nonce) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&report.node_id, &report.nonce],
    )
    .await?
        == 1;
    if !fresh || report.nonce.is_empty() {
        let reason = replayed(report);
        fleet_event(tx, now, REJECTED, node, &reason).await?;
        return Ok(BindingOutcome::Rejected(reason));
    }
    let mut gpus = report.gpu_uuids.clone();
    gpus.sort();
    execute(
        tx,
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

pub(super) async fn list(tx: &Tx<'_>, node_id: &str) -> Result<Vec<BindingRow>, StoreError> {
    let rows = query(
        tx,
        "SELECT allocation_id, gpus, state, spec_generation FROM bindings
         WHERE node_id = $1 ORDER BY allocation_id",
        &[&node_id],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(BindingRow {
            allocation_id: r.get(0),
            gpus: json_col(r, 1)?,
            state: r.get(2),
            spec_generation: r.get::<_, i64>(3) as u64,
        });
    }
    Ok(out)
}

/// The fleet events `q` selects, oldest first (the newest `limit` of them).
pub(super) async fn list_fleet_events(
    tx: &Tx<'_>,
    q: &crate::events::EventQuery,
) -> Result<Vec<crate::events::FleetEvent>, StoreError> {
    let limit = i64::from(q.limit.min(crate::events::EVENTS_READ_AT_MOST));
    let mut rows: Vec<crate::events::FleetEvent> = query(
        tx,
        "SELECT id, at, kind, node_id, detail FROM fleet_events
         WHERE id > $1 AND at >= $2 AND ($3::text IS NULL OR node_id = $3)
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
    .map(|r| crate::events::FleetEvent {
        id: r.get(0),
        at_ms: r.get(1),
        kind: r.get(2),
        node_id: r.get(3),
        detail: r.get(4),
    })
    .collect();
    rows.sort_by_key(|e| e.id);
    Ok(rows)
}

pub(super) async fn fleet_events(
    tx: &Tx<'_>,
    node_id: &str,
    limit: u32,
) -> Result<Vec<String>, StoreError> {
    Ok(query(
        tx,
        "SELECT kind, detail FROM fleet_events WHERE node_id = $1 ORDER BY id DESC LIMIT $2",
        &[&node_id, &i64::from(limit)],
    )
    .await?
    .iter()
    .map(|r| format!("{}: {}", r.get::<_, String>(0), r.get::<_, String>(1)))
    .collect())
}
