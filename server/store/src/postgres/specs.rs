//! Desired state and state reports.

use super::{Tx, execute, json_col, now, query_opt, to_json};
use crate::error::{Refusal, StoreError, TxError};
use crate::specs::{
    ChangeSpec, SealSpec, SectionReport, SectionRow, SpecBody, SpecView, applied_generation,
    sections_at,
};

/// Whether the node exists and is not deleted; with `lock`, its row is
/// held until the transaction ends (what changes a node's spec or state
/// takes it, so two changes queue instead of losing one).
async fn live_node(tx: &Tx<'_>, node_id: &str, lock: bool) -> Result<bool, StoreError> {
    let sql = if lock {
        "SELECT deleted_at FROM nodes WHERE id = $1 FOR NO KEY UPDATE"
    } else {
        "SELECT deleted_at FROM nodes WHERE id = $1"
    };
    let deleted: Option<Option<i64>> = query_opt(tx, sql, &[&node_id]).await?.map(|r| r.get(0));
    Ok(matches!(deleted, Some(None)))
}

/// The stored spec: generation and body.
async fn current(tx: &Tx<'_>, node_id: &str) -> Result<Option<(u64, SpecBody)>, StoreError> {
    let Some(r) = query_opt(
        tx,
        "SELECT generation, assignments, access FROM node_specs WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    else {
        return Ok(None);
    };
    Ok(Some((
        r.get::<_, i64>(0) as u64,
        SpecBody {
            assignments: json_col(&r, 1)?,
            access: json_col(&r, 2)?,
        },
    )))
}

pub(super) async fn update(
    tx: &Tx<'_>,
    node_id: &str,
    change: ChangeSpec,
    seal: SealSpec,
) -> Result<(u64, SpecBody), TxError> {
    if !live_node(tx, node_id, true).await? {
        return Err(Refusal::NoSuchNode(node_id.to_string()).into());
    }
    let (generation, mut body) = current(tx, node_id).await?.unwrap_or_default();
    change(&mut body)?;
    let now = now(tx).await?;
    let next = generation + 1;
    let signed = seal(next, now, &body);
    execute(
        tx,
        "INSERT INTO node_specs (node_id, generation, signed, assignments, access, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation,
             signed = excluded.signed, assignments = excluded.assignments,
             access = excluded.access, updated_at = excluded.updated_at",
        &[
            &node_id,
            &(next as i64),
            &signed,
            &to_json(&body.assignments),
            &to_json(&body.access),
            &now,
        ],
    )
    .await?;
    Ok((next, body))
}

pub(super) async fn signed(
    tx: &Tx<'_>,
    node_id: &str,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT generation, signed FROM node_specs WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    .map(|r| (r.get::<_, i64>(0) as u64, r.get(1))))
}

pub(super) async fn put_state_report(
    tx: &Tx<'_>,
    node_id: &str,
    applied: u64,
    sections: &[SectionReport],
) -> Result<(), StoreError> {
    let now = now(tx).await?;
    let stored: Option<i64> = query_opt(
        tx,
        "SELECT applied_generation FROM node_state WHERE node_id = $1 FOR UPDATE",
        &[&node_id],
    )
    .await?
    .map(|r| r.get(0));
    let generation = applied_generation(stored.map(|g| g.max(0) as u64), applied);
    execute(
        tx,
        "INSERT INTO node_state (node_id, applied_generation, sections, reported_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (node_id) DO UPDATE SET applied_generation = excluded.applied_generation,
             sections = excluded.sections, reported_at = excluded.reported_at",
        &[
            &node_id,
            &(generation.min(i64::MAX as u64) as i64),
            &to_json(&sections_at(now, sections)),
            &now,
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn view(tx: &Tx<'_>, node_id: &str) -> Result<Option<SpecView>, StoreError> {
    if !live_node(tx, node_id, false).await? {
        return Ok(None);
    }
    let now = now(tx).await?;
    let (desired_generation, body) = current(tx, node_id).await?.unwrap_or_default();
    let state = match query_opt(
        tx,
        "SELECT applied_generation, sections, reported_at FROM node_state WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    {
        Some(r) => Some((
            r.get::<_, i64>(0),
            json_col::<Vec<SectionRow>>(&r, 1)?,
            r.get::<_, i64>(2),
        )),
        None => None,
    };
    let (applied_generation, sections, reported_age_ms) = match state {
        Some((g, s, at)) => (g.max(0) as u64, s, Some(now - at)),
        None => (0, Vec::new(), None),
    };
    Ok(Some(SpecView {
        desired_generation,
        assignments: body.assignments,
        access: body.access,
        applied_generation,
        sections,
        reported_age_ms,
        now_ms: now,
    }))
}
