//! The secret broker's values (`crate::secrets`).

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{StoreError, TxError};
use crate::secrets::{Put, SealSecret, SecretRow, SecretSummary, exists, missing, unsealed};

fn summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretSummary> {
    Ok(SecretSummary {
        name: r.get(0)?,
        version: r.get::<_, i64>(1)? as u64,
        created_ms: r.get(2)?,
        created_by: r.get(3)?,
    })
}

/// The newest version of `name` and whether it is deleted.
fn newest(c: &Connection, name: &str) -> Result<Option<(u64, bool)>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT version, deleted_at IS NOT NULL FROM secrets WHERE name = ?1 \
         ORDER BY version DESC LIMIT 1",
    )?
    .query_row([name], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
    .optional()?)
}

pub(super) fn put(
    c: &Connection,
    name: &str,
    put: Put,
    by: &str,
    seal: SealSecret,
) -> Result<SecretSummary, TxError> {
    let newest = newest(c, name)?;
    let live = newest.is_some_and(|(_, deleted)| !deleted);
    match put {
        Put::New if live => return Err(exists(name).into()),
        Put::Rotate if !live => return Err(missing(name).into()),
        _ => {}
    }
    let version = newest.map_or(1, |(v, _)| v + 1);
    let sealed = seal(version).ok_or_else(unsealed)?;
    Ok(c.prepare_cached(
        "INSERT INTO secrets (name, version, sealed, created_at, created_by) \
         VALUES (?1, ?2, ?3, compute_now(), ?4) \
         RETURNING name, version, created_at, created_by",
    )?
    .query_row(params![name, version as i64, sealed, by], summary)
    .map_err(StoreError::from)?)
}

pub(super) fn get(
    c: &Connection,
    name: &str,
    version: u64,
) -> Result<Option<SecretRow>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT name, version, sealed, created_at, created_by FROM secrets \
         WHERE name = ?1 AND version = ?2 AND deleted_at IS NULL",
    )?
    .query_row(params![name, version as i64], |r| {
        Ok(SecretRow {
            name: r.get(0)?,
            version: r.get::<_, i64>(1)? as u64,
            sealed: r.get(2)?,
            created_ms: r.get(3)?,
            created_by: r.get(4)?,
        })
    })
    .optional()?)
}

pub(super) fn list(c: &Connection) -> Result<Vec<SecretSummary>, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT s.name, s.version, s.created_at, s.created_by FROM secrets s \
         WHERE s.deleted_at IS NULL \
           AND s.version = (SELECT MAX(version) FROM secrets WHERE name = s.name) \
         ORDER BY s.name",
    )?;
    let rows = st.query_map([], summary)?.collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub(super) fn delete(c: &Connection, name: &str) -> Result<SecretSummary, TxError> {
    let Some(newest) = list_one(c, name)? else {
        return Err(missing(name).into());
    };
    c.prepare_cached(
        "UPDATE secrets SET sealed = X'', deleted_at = compute_now() \
         WHERE name = ?1 AND deleted_at IS NULL",
    )?
    .execute([name])
    .map_err(StoreError::from)?;
    Ok(newest)
}

fn list_one(c: &Connection, name: &str) -> Result<Option<SecretSummary>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT name, version, created_at, created_by FROM secrets \
         WHERE name = ?1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1",
    )?
    .query_row([name], summary)
    .optional()?)
}
