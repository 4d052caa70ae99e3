//! The secret broker's values (`crate::secrets`).

use super::{Db, Dialect, Row};
use crate::error::{StoreError, TxError};
use crate::secrets::{Put, SealSecret, SecretRow, SecretSummary, exists, missing, unsealed};

fn summary(r: &Row) -> Result<SecretSummary, StoreError> {
    Ok(SecretSummary {
        name: r.get(0)?,
        version: r.get::<i64>(1)? as u64,
        created_ms: r.get(2)?,
        created_by: r.get(3)?,
    })
}

pub(crate) async fn put(
    db: &impl Db,
    name: &str,
    put: Put,
    by: &str,
    seal: SealSecret,
) -> Result<SecretSummary, TxError> {
    // Puts of one name wait for each other: the next version is decided
    // once (SQLite's one writer does this for every write).
    if db.dialect() == Dialect::Postgres {
        db.execute(
            "SELECT pg_advisory_xact_lock(hashtext('secrets:' || $1))",
            &[&name],
        )
        .await?;
    }
    let newest = db
        .query_opt(
            "SELECT version, deleted_at IS NOT NULL FROM secrets WHERE name = $1 \
             ORDER BY version DESC LIMIT 1",
            &[&name],
        )
        .await?
        .map(|r| Ok::<_, StoreError>((r.get::<i64>(0)? as u64, r.get::<bool>(1)?)))
        .transpose()?;
    let live = newest.is_some_and(|(_, deleted)| !deleted);
    match put {
        Put::New if live => return Err(exists(name).into()),
        Put::Rotate if !live => return Err(missing(name).into()),
        _ => {}
    }
    let version = newest.map_or(1, |(v, _)| v + 1);
    let sealed = seal(version).ok_or_else(unsealed)?;
    let row = db
        .query_one(
            "INSERT INTO secrets (name, version, sealed, created_at, created_by) \
             VALUES ($1, $2, $3, compute_now(), $4) \
             RETURNING name, version, created_at, created_by",
            &[&name, &(version as i64), &sealed, &by],
        )
        .await?;
    Ok(summary(&row)?)
}

pub(crate) async fn get(
    db: &impl Db,
    name: &str,
    version: u64,
) -> Result<Option<SecretRow>, StoreError> {
    db.query_opt(
        "SELECT name, version, sealed, created_at, created_by FROM secrets \
         WHERE name = $1 AND version = $2 AND deleted_at IS NULL",
        &[&name, &(version as i64)],
    )
    .await?
    .map(|r| {
        Ok(SecretRow {
            name: r.get(0)?,
            version: r.get::<i64>(1)? as u64,
            sealed: r.get(2)?,
            created_ms: r.get(3)?,
            created_by: r.get(4)?,
        })
    })
    .transpose()
}

/// Each live secret at its newest version.
pub(crate) async fn list(db: &impl Db) -> Result<Vec<SecretSummary>, StoreError> {
    db.query(
        "SELECT s.name, s.version, s.created_at, s.created_by FROM secrets s \
         WHERE s.deleted_at IS NULL \
           AND s.version = (SELECT MAX(version) FROM secrets WHERE name = s.name) \
         ORDER BY s.name",
        &[],
    )
    .await?
    .iter()
    .map(summary)
    .collect()
}

/// Deletes a secret: every version's sealed value is wiped and the rows
/// stay, marked deleted, so its versions are never handed out again.
pub(crate) async fn delete(db: &impl Db, name: &str) -> Result<SecretSummary, TxError> {
    let newest = db
        .query_opt(
            "SELECT name, version, created_at, created_by FROM secrets \
             WHERE name = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1 FOR UPDATE",
            &[&name],
        )
        .await?
        .map(|r| summary(&r))
        .transpose()?
        .ok_or_else(|| missing(name))?;
    let wiped: &[u8] = &[];
    db.execute(
        "UPDATE secrets SET sealed = $2, deleted_at = compute_now() \
         WHERE name = $1 AND deleted_at IS NULL",
        &[&name, &wiped],
    )
    .await?;
    Ok(newest)
}
