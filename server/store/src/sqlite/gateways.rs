//! Gateway credentials (`crate::gateways`).

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{StoreError, TxError};
use crate::gateways::{
    CERT_KEPT_PAST_END_MS, GatewayCert, GatewayCredential, LISTED_PAST_END_MS, SignedRevocations,
    name_taken,
};

const COLUMNS: &str = "name, secret_sha256, created_at, revoked_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GatewayCredential> {
    Ok(GatewayCredential {
        name: r.get(0)?,
        secret_sha256: r.get(1)?,
        created_ms: r.get(2)?,
        revoked_ms: r.get(3)?,
    })
}

pub(super) fn add(c: &Connection, name: &str, secret_sha256: &str) -> Result<i64, TxError> {
    // A revoked name may be added again; a live one may not.
    c.prepare_cached(
        "INSERT INTO gateway_credentials (name, secret_sha256, created_at) \
         VALUES (?1, ?2, compute_now()) \
         ON CONFLICT (name) DO UPDATE SET secret_sha256 = excluded.secret_sha256, \
             created_at = excluded.created_at, revoked_at = NULL \
         WHERE gateway_credentials.revoked_at IS NOT NULL \
         RETURNING created_at",
    )?
    .query_row(params![name, secret_sha256], |r| r.get(0))
    .optional()?
    .ok_or_else(|| TxError::Refused(name_taken(name)))
}

pub(super) fn get(c: &Connection, name: &str) -> Result<Option<GatewayCredential>, StoreError> {
    Ok(c.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM gateway_credentials WHERE name = ?1"
    ))?
    .query_row([name], row)
    .optional()?)
}

pub(super) fn list(c: &Connection) -> Result<Vec<GatewayCredential>, StoreError> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM gateway_credentials ORDER BY name"
    ))?;
    let rows = st.query_map([], row)?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub(super) fn revoke(c: &Connection, name: &str) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(
        "UPDATE gateway_credentials SET revoked_at = compute_now() \
         WHERE name = ?1 AND revoked_at IS NULL",
    )?
    .execute([name])?
        == 1)
}

pub(super) fn record_cert(c: &Connection, cert: &GatewayCert) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO gateway_certs (sha256, name, issued_at, not_after) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (sha256) DO NOTHING",
    )?
    .execute(params![
        cert.sha256,
        cert.name,
        cert.issued_ms,
        cert.not_after_ms
    ])?;
    Ok(())
}

pub(super) fn revoked_certs(c: &Connection) -> Result<Vec<GatewayCert>, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT c.name, c.sha256, c.issued_at, c.not_after FROM gateway_certs c \
         LEFT JOIN gateway_credentials g ON g.name = c.name \
         WHERE c.not_after > compute_now() - ?1 \
           AND (g.name IS NULL OR g.revoked_at IS NOT NULL OR c.issued_at < g.created_at) \
         ORDER BY c.issued_at, c.sha256",
    )?;
    let rows = st
        .query_map([LISTED_PAST_END_MS], |r| {
            Ok(GatewayCert {
                name: r.get(0)?,
                sha256: r.get(1)?,
                issued_ms: r.get(2)?,
                not_after_ms: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub(super) fn revocations(c: &Connection) -> Result<Option<SignedRevocations>, StoreError> {
    Ok(
        c.prepare_cached("SELECT issued_at, envelope FROM gateway_revocations WHERE id = 1")?
            .query_row([], |r| {
                Ok(SignedRevocations {
                    issued_ms: r.get(0)?,
                    envelope: r.get(1)?,
                })
            })
            .optional()?,
    )
}

pub(super) fn put_revocations(c: &Connection, list: &SignedRevocations) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO gateway_revocations (id, issued_at, envelope) VALUES (1, ?1, ?2) \
         ON CONFLICT (id) DO UPDATE SET issued_at = excluded.issued_at, \
             envelope = excluded.envelope",
    )?
    .execute(params![list.issued_ms, list.envelope])?;
    c.prepare_cached("DELETE FROM gateway_certs WHERE not_after < compute_now() - ?1")?
        .execute([CERT_KEPT_PAST_END_MS])?;
    Ok(())
}
