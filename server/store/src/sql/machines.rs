//! Machines enrolled by their EK (`crate::machines`).

use super::{Db, Row};
use crate::error::{StoreError, TxError};
use crate::machines::{Enrolment, EnrolmentKind, NewEnrolment, already_enrolled, no_enrolment};

const SELECT: &str = "SELECT m.id, m.kind, m.ek_sha256, m.ca_der, m.subject, m.description, \
     m.created_at, n.id, m.ca_intermediates FROM machine_enrolments m \
     LEFT JOIN nodes n ON n.ek_sha256 = m.ek_sha256 AND n.deleted_at IS NULL";

fn row(r: &Row) -> Result<Enrolment, StoreError> {
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

async fn get(db: &impl Db, id: &str) -> Result<Option<Enrolment>, StoreError> {
    db.query_opt(&format!("{SELECT} WHERE m.id = $1"), &[&id])
        .await?
        .as_ref()
        .map(row)
        .transpose()
}

pub(crate) async fn enrol(db: &impl Db, e: &NewEnrolment) -> Result<Enrolment, TxError> {
    let id = e.id();
    let added = db
        .execute(
            "INSERT INTO machine_enrolments \
             (id, kind, ek_sha256, ca_der, subject, description, created_at, ca_intermediates) \
             VALUES ($1, $2, $3, $4, $5, $6, compute_now(), $7) ON CONFLICT (id) DO NOTHING",
            &[
                &id,
                &e.kind.as_str(),
                &e.ek_sha256,
                &e.ca_der,
                &e.subject,
                &e.description,
                &e.ca_intermediates,
            ],
        )
        .await?;
    if added == 0 {
        return Err(already_enrolled(&id).into());
    }
    get(db, &id).await?.ok_or_else(|| no_enrolment(&id).into())
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<Enrolment>, StoreError> {
    db.query(&format!("{SELECT} ORDER BY m.kind, m.id"), &[])
        .await?
        .iter()
        .map(row)
        .collect()
}

pub(crate) async fn remove(db: &impl Db, id: &str) -> Result<Enrolment, TxError> {
    let e = get(db, id).await?.ok_or_else(|| no_enrolment(id))?;
    db.execute("DELETE FROM machine_enrolments WHERE id = $1", &[&id])
        .await?;
    Ok(e)
}
