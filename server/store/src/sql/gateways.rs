//! Gateway credentials (`crate::gateways`).

use super::{Db, Row};
use crate::error::{StoreError, TxError};
use crate::gateways::{
    CERT_KEPT_PAST_END_MS, GatewayCert, GatewayCredential, LISTED_PAST_END_MS, SignedRevocations,
    name_taken,
};
use crate::id::GatewayId;

const COLUMNS: &str = "name, secret_sha256, created_at, revoked_at";

fn row(r: &Row) -> Result<GatewayCredential, StoreError> {
    Ok(GatewayCredential {
        name: r.get(0)?,
        secret_sha256: r.get(1)?,
        created_ms: r.get(2)?,
        revoked_ms: r.get(3)?,
    })
}

pub(crate) async fn add(
    db: &impl Db,
    name: &GatewayId,
    secret_sha256: &str,
) -> Result<i64, TxError> {
    // A revoked name may be added again; a live one may not.
    let created = db
        .query_opt(
            "INSERT INTO gateway_credentials (name, secret_sha256, created_at) \
             VALUES ($1, $2, compute_now()) \
             ON CONFLICT (name) DO UPDATE SET secret_sha256 = excluded.secret_sha256, \
                 created_at = excluded.created_at, revoked_at = NULL \
             WHERE gateway_credentials.revoked_at IS NOT NULL \
             RETURNING created_at",
            &[&name, &secret_sha256],
        )
        .await?;
    match created {
        Some(r) => Ok(r.get(0)?),
        None => Err(TxError::Refused(name_taken(name))),
    }
}

pub(crate) async fn get(
    db: &impl Db,
    name: &GatewayId,
) -> Result<Option<GatewayCredential>, StoreError> {
    db.query_opt(
        &format!("SELECT {COLUMNS} FROM gateway_credentials WHERE name = $1"),
        &[&name],
    )
    .await?
    .as_ref()
    .map(row)
    .transpose()
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<GatewayCredential>, StoreError> {
    db.query(
        &format!("SELECT {COLUMNS} FROM gateway_credentials ORDER BY name"),
        &[],
    )
    .await?
    .iter()
    .map(row)
    .collect()
}

pub(crate) async fn revoke(db: &impl Db, name: &GatewayId) -> Result<bool, StoreError> {
    Ok(db
        .execute(
            "UPDATE gateway_credentials SET revoked_at = compute_now() \
             WHERE name = $1 AND revoked_at IS NULL",
            &[&name],
        )
        .await?
        == 1)
}

pub(crate) async fn record_cert(db: &impl Db, cert: &GatewayCert) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO gateway_certs (sha256, name, issued_at, not_after) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (sha256) DO NOTHING",
        &[
            &cert.sha256,
            &cert.name,
            &cert.issued_ms,
            &cert.not_after_ms,
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn revoked_certs(db: &impl Db) -> Result<Vec<GatewayCert>, StoreError> {
    db.query(
        "SELECT c.name, c.sha256, c.issued_at, c.not_after FROM gateway_certs c \
         LEFT JOIN gateway_credentials g ON g.name = c.name \
         WHERE c.not_after > compute_now() - $1 \
           AND (g.name IS NULL OR g.revoked_at IS NOT NULL OR c.issued_at < g.created_at) \
         ORDER BY c.issued_at, c.sha256",
        &[&LISTED_PAST_END_MS],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(GatewayCert {
            name: r.get(0)?,
            sha256: r.get(1)?,
            issued_ms: r.get(2)?,
            not_after_ms: r.get(3)?,
        })
    })
    .collect()
}

pub(crate) async fn revocations(db: &impl Db) -> Result<Option<SignedRevocations>, StoreError> {
    db.query_opt(
        "SELECT issued_at, envelope FROM gateway_revocations WHERE id = 1",
        &[],
    )
    .await?
    .map(|r| {
        Ok(SignedRevocations {
            issued_ms: r.get(0)?,
            envelope: r.get(1)?,
        })
    })
    .transpose()
}

pub(crate) async fn put_revocations(
    db: &impl Db,
    list: &SignedRevocations,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO gateway_revocations (id, issued_at, envelope) VALUES (1, $1, $2) \
         ON CONFLICT (id) DO UPDATE SET issued_at = excluded.issued_at, \
             envelope = excluded.envelope",
        &[&list.issued_ms, &list.envelope],
    )
    .await?;
    db.execute(
        "DELETE FROM gateway_certs WHERE not_after < compute_now() - $1",
        &[&CERT_KEPT_PAST_END_MS],
    )
    .await?;
    Ok(())
}
