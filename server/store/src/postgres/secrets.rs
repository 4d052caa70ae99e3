//! The secret broker's values (`crate::secrets`).

use super::{Tx, execute, query, query_opt};
use crate::error::{StoreError, TxError};
use crate::secrets::{Put, SealSecret, SecretRow, SecretSummary, exists, missing, unsealed};

fn summary(r: &tokio_postgres::Row) -> SecretSummary {
    SecretSummary {
        name: r.get(0),
        version: r.get::<_, i64>(1) as u64,
        created_ms: r.get(2),
        created_by: r.get(3),
    }
}

pub(super) async fn put(
    tx: &Tx<'_>,
    name: &str,
    put: Put,
    by: &str,
    seal: SealSecret,
) -> Result<SecretSummary, TxError> {
    // Puts of one name wait for each other: the next version is decided
    // once.
    execute(
        tx,
        "SELECT pg_advisory_xact_lock(hashtext('secrets:' || $1))",
        &[&name],
    )
    .await
    .map_err(StoreError::from)?;
    let newest = query_opt(
        tx,
        "SELECT version, deleted_at IS NOT NULL FROM secrets WHERE name = $1 \
         ORDER BY version DESC LIMIT 1",
        &[&name],
    )
    .await
    .map_err(StoreError::from)?
    .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, bool>(1)));
    let live = newest.is_some_and(|(_, deleted)| !deleted);
    match put {
        Put::New if live => return Err(exists(name).into()),
        Put::Rotate if !live => return Err(missing(name).into()),
        _ => {}
    }
    let version = newest.map_or(1, |(v, _)| v + 1);
    let sealed = seal(version).ok_or_else(unsealed)?;
    let row = query_opt(
        tx,
        "INSERT INTO secrets (name, version, sealed, created_at, created_by) \
         VALUES ($1, $2, $3, compute_now(), $4) \
         RETURNING name, version, created_at, created_by",
        &[&name, &(version as i64), &sealed, &by],
    )
    .await
    .map_err(StoreError::from)?
    .ok_or_else(|| StoreError::Corrupt("an insert returned no row".into()))?;
    Ok(summary(&row))
}

pub(super) async fn get(
    tx: &Tx<'_>,
    name: &str,
    version: u64,
) -> Result<Option<SecretRow>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT name, version, sealed, created_at, created_by FROM secrets \
         WHERE name = $1 AND version = $2 AND deleted_at IS NULL",
        &[&name, &(version as i64)],
    )
    .await?
    .map(|r| SecretRow {
        name: r.get(0),
        version: r.get::<_, i64>(1) as u64,
        sealed: r.get(2),
        created_ms: r.get(3),
        created_by: r.get(4),
    }))
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<SecretSummary>, StoreError> {
    Ok(query(
        tx,
        "SELECT DISTINCT ON (name) name, version, created_at, created_by FROM secrets \
         WHERE deleted_at IS NULL ORDER BY name, version DESC",
        &[],
    )
    .await?
    .iter()
    .map(summary)
    .collect())
}

pub(super) async fn delete(tx: &Tx<'_>, name: &str) -> Result<SecretSummary, TxError> {
    let newest = query_opt(
        tx,
        "SELECT name, version, created_at, created_by FROM secrets \
         WHERE name = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1 FOR UPDATE",
        &[&name],
    )
    .await
    .map_err(StoreError::from)?
    .map(|r| summary(&r))
    .ok_or_else(|| missing(name))?;
    execute(
        tx,
        "UPDATE secrets SET sealed = '\\x'::bytea, deleted_at = compute_now() \
         WHERE name = $1 AND deleted_at IS NULL",
        &[&name],
    )
    .await
    .map_err(StoreError::from)?;
    Ok(newest)
}
