//! Desired state and state reports.

use rusqlite::{Connection, OptionalExtension, params};

use std::time::Duration;

use super::bindings::fleet_event;
use super::nodes::valid_certs;
use super::{Kept, json_col, ms, now, to_json};
use crate::bindings::VerifySignature;
use crate::error::{Refusal, StoreError, TxError};
use crate::nodes::{Signed, judge_signed};
use crate::specs::{
    ChangeSpec, FORGED, FactApplied, LIFETIME, OpenSpec, SPEC_FORGED, SealSpec, SectionRow,
    SpecBody, SpecSeal, SpecView, StateReportInput, applied_generation, forged_refusal,
    report_applies, sections_at, start_from,
};

/// Whether the node exists and is not deleted.
fn live_node(c: &Connection, node_id: &str) -> rusqlite::Result<bool> {
    let deleted: Option<Option<i64>> = c
        .query_row_kept(
            "SELECT deleted_at FROM nodes WHERE id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(matches!(deleted, Some(None)))
}

/// The stored spec's generation and body as its columns show them: for the
/// operator's view only; a change starts from the signed bytes.
fn current(c: &Connection, node_id: &str) -> rusqlite::Result<Option<(u64, SpecBody)>> {
    c.query_row_kept(
        "SELECT generation, assignments, access FROM node_specs WHERE node_id = ?1",
        [node_id],
        |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                SpecBody {
                    assignments: json_col(r, 1)?,
                    access: json_col(r, 2)?,
                    intent: Default::default(),
                },
            ))
        },
    )
    .optional()
}

/// Changes a node's spec from what a worker signed last. `Ok(Err(_))`: the
/// stored spec did not open; its forgery is recorded (the transaction
/// commits that) and nothing is signed.
pub(super) fn update(
    c: &Connection,
    node_id: &str,
    change: ChangeSpec,
    open: OpenSpec,
    seal: SealSpec,
) -> Result<Result<(u64, SpecBody), Refusal>, TxError> {
    if !live_node(c, node_id)? {
        return Err(Refusal::NoSuchNode(node_id.to_string()).into());
    }
    let now = now(c)?;
    let stored = signed(c, node_id)?;
    let (generation, mut body) = match start_from(stored.as_ref().map(|(_, b)| &b[..]), open) {
        Ok(start) => start,
        Err(why) => {
            fleet_event(c, now, SPEC_FORGED, node_id, &why)?;
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
    c.execute_kept(
        "INSERT INTO node_specs (node_id, generation, signed, assignments, access, updated_at,
             not_after)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation,
             signed = excluded.signed, assignments = excluded.assignments,
             access = excluded.access, updated_at = excluded.updated_at,
             not_after = excluded.not_after",
        params![
            node_id,
            next as i64,
            signed,
            to_json(&body.assignments),
            to_json(&body.access),
            now,
            sealed.not_after_ms
        ],
    )?;
    Ok(Ok((next, body)))
}

pub(super) fn signed_all(c: &Connection) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT s.node_id, s.signed FROM node_specs s JOIN nodes n ON n.id = s.node_id
             WHERE n.deleted_at IS NULL ORDER BY s.node_id",
    )?
    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
    .collect::<rusqlite::Result<Vec<_>>>()?)
}

pub(super) fn expiring(c: &Connection, within: Duration) -> Result<Vec<String>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT s.node_id FROM node_specs s JOIN nodes n ON n.id = s.node_id
             WHERE n.deleted_at IS NULL AND s.not_after < compute_now() + ?1
             ORDER BY s.not_after",
        )?
        .query_map([ms(within)], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(rows)
}

pub(super) fn signed(c: &Connection, node_id: &str) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    Ok(
        c.prepare_cached("SELECT generation, signed FROM node_specs WHERE node_id = ?1")?
            .query_row([node_id], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
            .optional()?,
    )
}

pub(super) fn put_state_report(
    c: &Connection,
    node_id: &str,
    signed: &Signed<StateReportInput>,
    verify: VerifySignature,
) -> Result<FactApplied, StoreError> {
    let now = now(c)?;
    let certs = valid_certs(c, node_id, now)?;
    let report = match judge_signed(node_id, signed, &certs, verify) {
        Ok(r) => r,
        Err(reason) => {
            fleet_event(c, now, FORGED, node_id, &reason)?;
            return Ok(FactApplied::Forged(reason));
        }
    };
    let stored: Option<(i64, i64)> = c
        .prepare_cached(
            "SELECT applied_generation, report_epoch FROM node_state WHERE node_id = ?1",
        )?
        .query_row([node_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((_, stored_epoch)) = stored
        && !report_applies(stored_epoch.max(0) as u64, report.epoch)
    {
        return Ok(FactApplied::Stale);
    }
    let generation = applied_generation(
        stored.map(|(g, _)| g.max(0) as u64),
        report.applied_generation,
    );
    c.prepare_cached(
        "INSERT INTO node_state (node_id, applied_generation, sections, reported_at, report_epoch)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (node_id) DO UPDATE SET applied_generation = excluded.applied_generation,
             sections = excluded.sections, reported_at = excluded.reported_at,
             report_epoch = excluded.report_epoch",
    )?
    .execute(params![
        node_id,
        generation as i64,
        to_json(&sections_at(now, &report.sections)),
        now,
        report.epoch as i64
    ])?;
    Ok(FactApplied::Applied)
}

pub(super) fn view(c: &Connection, node_id: &str) -> Result<Option<SpecView>, StoreError> {
    if !live_node(c, node_id)? {
        return Ok(None);
    }
    let now = now(c)?;
    let (desired_generation, body) = current(c, node_id)?.unwrap_or_default();
    let state: Option<(i64, Vec<SectionRow>, i64)> = c
        .query_row_kept(
            "SELECT applied_generation, sections, reported_at FROM node_state WHERE node_id = ?1",
            [node_id],
            |r| Ok((r.get(0)?, json_col(r, 1)?, r.get(2)?)),
        )
        .optional()?;
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
