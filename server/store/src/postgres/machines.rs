//! Machines enrolled by their EK (`crate::machines`).

use super::{Tx, execute, query, query_opt};
use crate::error::{StoreError, TxError};
use crate::machines::{Enrolment, EnrolmentKind, NewEnrolment, already_enrolled, no_enrolment};

const SELECT: &str = "SELECT m.id, m.kind, m.ek_sha256, m.ca_der, m.subject, m.description, \
     m.created_at, n.id, m.ca_intermediates FROM machine_enrolments m \
     LEFT JOIN nodes n ON n.ek_sha256 = m.ek_sha256 AND n.deleted_at IS NULL";

fn row(r: &tokio_postgres::Row) -> Enrolment {
    let kind: String = r.get(1);
    Enrolment {
        id: r.get(0),
        kind: EnrolmentKind::parse(&kind).unwrap_or(EnrolmentKind::Ek),
        ek_sha256: r.get(2),
        ca_der: r.get(3),
        subject: r.get(4),
        description: r.get(5),
        created_ms: r.get(6),
        node_id: r.get(7),
        ca_intermediates: r.get(8),
    }
}

async fn get(tx: &Tx<'_>, id: &str) -> Result<Option<Enrolment>, StoreError> {
    Ok(query_opt(tx, &format!("{SELECT} WHERE m.id = $1"), &[&id])
        .await?
        .as_ref()
        .map(row))
}

pub(super) async fn enrol(tx: &Tx<'_>, e: &NewEnrolment) -> Result<Enrolment, TxError> {
    let id = e.id();
    let added = execute(
        tx,
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
    get(tx, &id).await?.ok_or_else(|| no_enrolment(&id).into())
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<Enrolment>, StoreError> {
    Ok(query(tx, &format!("{SELECT} ORDER BY m.kind, m.id"), &[])
        .await?
        .iter()
        .map(row)
        .collect())
}

pub(super) async fn remove(tx: &Tx<'_>, id: &str) -> Result<Enrolment, TxError> {
    let e = get(tx, id).await?.ok_or_else(|| no_enrolment(id))?;
    execute(tx, "DELETE FROM machine_enrolments WHERE id = $1", &[&id]).await?;
    Ok(e)
}
