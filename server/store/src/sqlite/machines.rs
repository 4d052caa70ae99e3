//! Machines enrolled by their EK (`crate::machines`).

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{StoreError, TxError};
use crate::machines::{Enrolment, EnrolmentKind, NewEnrolment, already_enrolled, no_enrolment};

const SELECT: &str = "SELECT m.id, m.kind, m.ek_sha256, m.ca_der, m.subject, m.description, \
     m.created_at, n.id, m.ca_intermediates FROM machine_enrolments m \
     LEFT JOIN nodes n ON n.ek_sha256 = m.ek_sha256 AND n.deleted_at IS NULL";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Enrolment> {
    let kind: String = r.get(1)?;
    Ok(Enrolment {
        id: r.get(0)?,
        kind: EnrolmentKind::parse(&kind).unwrap_or(EnrolmentKind::Ek),
        ek_sha256: r.get(2)?,
        ca_der: r.get(3)?,
        subject: r.get(4)?,
        description: r.get(5)?,
        created_ms: r.get(6)?,
        node_id: r.get(7)?,
        ca_intermediates: r.get(8)?,
    })
}

fn get(c: &Connection, id: &str) -> Result<Option<Enrolment>, StoreError> {
    Ok(c.prepare_cached(&format!("{SELECT} WHERE m.id = ?1"))?
        .query_row([id], row)
        .optional()?)
}

pub(super) fn enrol(c: &Connection, e: &NewEnrolment) -> Result<Enrolment, TxError> {
    let id = e.id();
    let added = c
        .prepare_cached(
            "INSERT INTO machine_enrolments \
             (id, kind, ek_sha256, ca_der, subject, description, created_at, ca_intermediates) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, compute_now(), ?7) ON CONFLICT (id) DO NOTHING",
        )?
        .execute(params![
            id,
            e.kind.as_str(),
            e.ek_sha256,
            e.ca_der,
            e.subject,
            e.description,
            e.ca_intermediates
        ])?;
    if added == 0 {
        return Err(already_enrolled(&id).into());
    }
    get(c, &id)?.ok_or_else(|| no_enrolment(&id).into())
}

pub(super) fn list(c: &Connection) -> Result<Vec<Enrolment>, StoreError> {
    let mut st = c.prepare_cached(&format!("{SELECT} ORDER BY m.kind, m.id"))?;
    let rows = st.query_map([], row)?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub(super) fn remove(c: &Connection, id: &str) -> Result<Enrolment, TxError> {
    let e = get(c, id)?.ok_or_else(|| no_enrolment(id))?;
    c.prepare_cached("DELETE FROM machine_enrolments WHERE id = ?1")?
        .execute([id])?;
    Ok(e)
}
