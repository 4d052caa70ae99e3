//! Desired state and state reports.

use rusqlite::{Connection, OptionalExtension, params};

use super::{json_col, now, to_json};
use crate::error::{Refusal, StoreError, TxError};
use crate::specs::{
    ChangeSpec, SealSpec, SectionReport, SectionRow, SpecBody, SpecView, applied_generation,
    sections_at,
};

/// Whether the node exists and is not deleted.
fn live_node(c: &Connection, node_id: &str) -> rusqlite::Result<bool> {
    let deleted: Option<Option<i64>> = c
        .query_row(
            "SELECT deleted_at FROM nodes WHERE id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(matches!(deleted, Some(None)))
}

/// The stored spec: generation and body.
fn current(c: &Connection, node_id: &str) -> rusqlite::Result<Option<(u64, SpecBody)>> {
    c.query_row(
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
    let signed = seal(next, now, &body);
    c.execute(
        "INSERT INTO node_specs (node_id, generation, signed, assignments, access, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (node_id) DO UPDATE SET generation = excluded.generation,
             signed = excluded.signed, assignments = excluded.assignments,
             access = excluded.access, updated_at = excluded.updated_at",
        params![
            node_id,
            next as i64,
            signed,
            to_json(&body.assignments),
            to_json(&body.access),
            now
        ],
    )?;
    Ok((next, body))
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
    applied: u64,
    sections: &[SectionReport],
) -> Result<(), StoreError> {
    let now = now(c)?;
    let stored: Option<i64> = c
        .prepare_cached("SELECT applied_generation FROM node_state WHERE node_id = ?1")?
        .query_row([node_id], |r| r.get(0))
        .optional()?;
    let generation = applied_generation(stored.map(|g| g.max(0) as u64), applied);
    c.prepare_cached(
        "INSERT INTO node_state (node_id, applied_generation, sections, reported_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (node_id) DO UPDATE SET applied_generation = excluded.applied_generation,
             sections = excluded.sections, reported_at = excluded.reported_at",
    )?
    .execute(params![
        node_id,
        generation as i64,
        to_json(&sections_at(now, sections)),
        now
    ])?;
    Ok(())
}

pub(super) fn view(c: &Connection, node_id: &str) -> Result<Option<SpecView>, StoreError> {
    if !live_node(c, node_id)? {
        return Ok(None);
    }
    let now = now(c)?;
    let (desired_generation, body) = current(c, node_id)?.unwrap_or_default();
    let state: Option<(i64, Vec<SectionRow>, i64)> = c
        .query_row(
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
