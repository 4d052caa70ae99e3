//! Desired state and state reports.

use std::time::Duration;

use super::bindings::fleet_event;
use super::nodes::valid_certs;
use super::{Db, to_json};
use crate::bindings::VerifySignature;
use crate::clock::ms;
use crate::error::{Refusal, StoreError, TxError};
use crate::id::NodeId;
use crate::nodes::{Signed, judge_signed};
use crate::specs::{
    ChangeSpec, FORGED, FactApplied, LIFETIME, OpenSpec, SPEC_FORGED, SealSpec, SectionRow,
    SpecBody, SpecSeal, SpecView, StateReportInput, applied_generation, forged_refusal,
    report_applies, sections_at, start_from,
};

/// Whether the node exists and is not deleted; with `lock`, its row is
/// held until the transaction ends (what changes a node's spec or state
/// takes it, so two changes queue instead of losing one).
async fn live_node(db: &impl Db, node_id: &NodeId, lock: bool) -> Result<bool, StoreError> {
    let sql = if lock {
        "SELECT deleted_at FROM nodes WHERE id = $1 FOR NO KEY UPDATE"
    } else {
        "SELECT deleted_at FROM nodes WHERE id = $1"
    };
    let deleted: Option<Option<i64>> = db
        .query_opt(sql, &[&node_id])
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    Ok(matches!(deleted, Some(None)))
}

/// The stored spec's generation and body as its columns show them: for the
/// operator's view only; a change starts from the signed bytes.
async fn current(db: &impl Db, node_id: &NodeId) -> Result<Option<(u64, SpecBody)>, StoreError> {
    let Some(r) = db
        .query_opt(
            "SELECT generation, assignments, access FROM node_specs WHERE node_id = $1",
            &[&node_id],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some((
        r.get::<i64>(0)? as u64,
        SpecBody {
            assignments: r.json(1)?,
            access: r.json(2)?,
            intent: Default::default(),
        },
    )))
}

/// Changes a node's spec from what a worker signed last. `Ok(Err(_))`: the
/// stored spec did not open; its forgery is recorded (the transaction
/// commits that) and nothing is signed.
pub(crate) async fn update(
    db: &impl Db,
    node_id: &NodeId,
    change: ChangeSpec,
    open: OpenSpec,
    seal: SealSpec,
) -> Result<Result<(u64, SpecBody), Refusal>, TxError> {
    if !live_node(db, node_id, true).await? {
        return Err(Refusal::NoSuchNode(node_id.to_string()).into());
    }
    let now = db.now().await?;
    let stored = signed(db, node_id).await?;
    let (generation, mut body) = match start_from(stored.as_ref().map(|(_, b)| &b[..]), open) {
        Ok(start) => start,
        Err(why) => {
            fleet_event(db, now, SPEC_FORGED, node_id, &why).await?;
            return Ok(Err(forged_refusal(node_id, &why)));
        }
    };
    change(&mut body)?;
    let next = generation + 1;
    let sealed = SpecSeal {
        generation: next,
        issued_at_ms: now,
        not_after_ms: now + ms(LIFETIME),
    };
    let signed = seal(&sealed, &body);
    db.execute(
        "INSERT INTO node_specs (node_id, generation, signed, assignments, access, updated_at,
             not_after)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation,
             signed = excluded.signed, assignments = excluded.assignments,
             access = excluded.access, updated_at = excluded.updated_at,
             not_after = excluded.not_after",
        &[
            &node_id,
            &(next as i64),
            &signed,
            &to_json(&body.assignments),
            &to_json(&body.access),
            &now,
            &sealed.not_after_ms,
        ],
    )
    .await?;
    Ok(Ok((next, body)))
}

pub(crate) async fn signed_all(db: &impl Db) -> Result<Vec<(NodeId, Vec<u8>)>, StoreError> {
    db.query(
        "SELECT s.node_id, s.signed FROM node_specs s JOIN nodes n ON n.id = s.node_id
         WHERE n.deleted_at IS NULL ORDER BY s.node_id",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get(0)?, r.get(1)?)))
    .collect()
}

pub(crate) async fn expiring(db: &impl Db, within: Duration) -> Result<Vec<NodeId>, StoreError> {
    db.column(
        "SELECT s.node_id FROM node_specs s JOIN nodes n ON n.id = s.node_id
         WHERE n.deleted_at IS NULL AND s.not_after < compute_now() + $1
         ORDER BY s.not_after",
        &[&ms(within)],
    )
    .await
}

pub(crate) async fn signed(
    db: &impl Db,
    node_id: &NodeId,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    db.query_opt(
        "SELECT generation, signed FROM node_specs WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    .map(|r| Ok((r.get::<i64>(0)? as u64, r.get(1)?)))
    .transpose()
}

pub(crate) async fn put_state_report(
    db: &impl Db,
    node_id: &NodeId,
    signed: &Signed<StateReportInput>,
    verify: VerifySignature,
) -> Result<FactApplied, StoreError> {
    let now = db.now().await?;
    let certs = valid_certs(db, node_id, now).await?;
    let report = match judge_signed(node_id, signed, &certs, verify) {
        Ok(r) => r,
        Err(reason) => {
            fleet_event(db, now, FORGED, node_id, &reason).await?;
            return Ok(FactApplied::Forged(reason));
        }
    };
    let stored: Option<(i64, i64)> = db
        .query_opt(
            "SELECT applied_generation, report_epoch FROM node_state WHERE node_id = $1 FOR UPDATE",
            &[&node_id],
        )
        .await?
        .map(|r| Ok::<_, StoreError>((r.get(0)?, r.get(1)?)))
        .transpose()?;
    if let Some((_, stored_epoch)) = stored
        && !report_applies(stored_epoch.max(0) as u64, report.epoch)
    {
        return Ok(FactApplied::Stale);
    }
    let generation = applied_generation(
        stored.map(|(g, _)| g.max(0) as u64),
        report.applied_generation,
    );
    db.execute(
        "INSERT INTO node_state (node_id, applied_generation, sections, reported_at, report_epoch)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (node_id) DO UPDATE SET applied_generation = excluded.applied_generation,
             sections = excluded.sections, reported_at = excluded.reported_at,
             report_epoch = excluded.report_epoch",
        &[
            &node_id,
            &(generation.min(i64::MAX as u64) as i64),
            &to_json(&sections_at(now, &report.sections)),
            &now,
            &(report.epoch.min(i64::MAX as u64) as i64),
        ],
    )
    .await?;
    Ok(FactApplied::Applied)
}

pub(crate) async fn view(db: &impl Db, node_id: &NodeId) -> Result<Option<SpecView>, StoreError> {
    if !live_node(db, node_id, false).await? {
        return Ok(None);
    }
    let now = db.now().await?;
    let (desired_generation, body) = current(db, node_id).await?.unwrap_or_default();
    let state = match db
        .query_opt(
            "SELECT applied_generation, sections, reported_at FROM node_state WHERE node_id = $1",
            &[&node_id],
        )
        .await?
    {
        Some(r) => Some((
            r.get::<i64>(0)?,
            r.json::<Vec<SectionRow>>(1)?,
            r.get::<i64>(2)?,
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
