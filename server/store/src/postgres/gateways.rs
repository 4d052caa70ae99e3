//! Gateway credentials (`crate::gateways`).

use super::{Tx, execute, query, query_opt};
use crate::error::{StoreError, TxError};
use crate::gateways::{GatewayCredential, name_taken};

const COLUMNS: &str = "name, secret_sha256, created_at, revoked_at";

fn row(r: &tokio_postgres::Row) -> GatewayCredential {
    GatewayCredential {
        name: r.get(0),
        secret_sha256: r.get(1),
        created_ms: r.get(2),
        revoked_ms: r.get(3),
    }
}

pub(super) async fn add(tx: &Tx<'_>, name: &str, secret_sha256: &str) -> Result<i64, TxError> {
    // A revoked name may be added again; a live one may not.
    let created = query_opt(
        tx,
        "INSERT INTO gateway_credentials (name, secret_sha256, created_at) \
         VALUES ($1, $2, compute_now()) \
         ON CONFLICT (name) DO UPDATE SET secret_sha256 = excluded.secret_sha256, \
             created_at = excluded.created_at, revoked_at = NULL \
         WHERE gateway_credentials.revoked_at IS NOT NULL \
         RETURNING created_at",
        &[&name, &secret_sha256],
    )
    .await
    .map_err(StoreError::from)?;
    created
        .map(|r| r.get(0))
        .ok_or_else(|| TxError::Refused(name_taken(name)))
}

pub(super) async fn get(tx: &Tx<'_>, name: &str) -> Result<Option<GatewayCredential>, StoreError> {
    Ok(query_opt(
        tx,
        &format!("SELECT {COLUMNS} FROM gateway_credentials WHERE name = $1"),
        &[&name],
    )
    .await?
    .as_ref()
    .map(row))
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<GatewayCredential>, StoreError> {
    Ok(query(
        tx,
        &format!("SELECT {COLUMNS} FROM gateway_credentials ORDER BY name"),
        &[],
    )
    .await?
    .iter()
    .map(row)
    .collect())
}

pub(super) async fn revoke(tx: &Tx<'_>, name: &str) -> Result<bool, StoreError> {
    Ok(execute(
        tx,
        "UPDATE gateway_credentials SET revoked_at = compute_now() \
         WHERE name = $1 AND revoked_at IS NULL",
        &[&name],
    )
    .await?
        == 1)
}
