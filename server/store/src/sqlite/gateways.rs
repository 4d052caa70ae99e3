//! Gateway credentials (`crate::gateways`).

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{StoreError, TxError};
use crate::gateways::{GatewayCredential, name_taken};

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
