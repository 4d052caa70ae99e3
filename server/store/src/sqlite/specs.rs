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
    ChangeSpec, FORGED, FactApplied, LIFETIME, SealSpec, SectionRow, SpecBody, SpecSeal, SpecView,
    StateReportInput, applied_generation, report_applies, sections_at,
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

/// The stored spec: generation and body.
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
                },
            ))
        },
    )
    .optional()
}

pub(super) fn update(
    c: &Connection,
    node_id: &str,
    change: ChangeSpec,
    seal: SealSpec,
) -> Result<(u64, SpecBody), TxError> {
    if !live_node(c, node_id)? {
        return Err(Refusal::NoSuchNode(node_id.to_string()).into());
    }
    let (generation, mut body) = current(c, node_id)?.unwrap_or_default();
    change(&mut body)?;
    let now = now(c)?;
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
    Ok((next, body))
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
