//! Leases.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, ms};
use crate::error::StoreError;
use crate::leases::LeaseRow;

pub(super) fn renew(
    c: &Connection,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(c.prepare_cached(
        "INSERT INTO leases (name, owner, expires_at, renewed_at)
             VALUES (?1, ?2, compute_now() + ?3, compute_now())
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, expires_at = excluded.expires_at,
                 renewed_at = excluded.renewed_at
             WHERE leases.owner = excluded.owner OR leases.expires_at < excluded.renewed_at
             RETURNING renewed_at",
    )?
    .query_row(params![name, owner, ms(ttl)], |r| r.get(0))
    .optional()?)
}

pub(super) fn release(c: &Connection, name: &str, owner: &str) -> Result<(), StoreError> {
    c.execute_kept(
        "DELETE FROM leases WHERE name = ?1 AND owner = ?2",
        params![name, owner],
    )?;
    Ok(())
}

pub(super) fn list(c: &Connection) -> Result<Vec<LeaseRow>, StoreError> {
    Ok(
        c.prepare_cached("SELECT name, owner, expires_at, renewed_at FROM leases ORDER BY name")?
            .query_map([], |r| {
                Ok(LeaseRow {
                    name: r.get(0)?,
                    owner: r.get(1)?,
                    expires_at_ms: r.get(2)?,
                    renewed_at_ms: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?,
    )
}
