//! Leases.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, ms};
use crate::error::StoreError;
use crate::leases::{Held, LeaseRow};

/// Takes a free or expired lease, or renews one `owner` holds; its
/// generation goes up unless `owner` renewed it in time.
pub(super) fn renew(
    c: &Connection,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<Held>, StoreError> {
    Ok(c.prepare_cached(
        "INSERT INTO leases (name, owner, expires_at, renewed_at)
             VALUES (?1, ?2, compute_now() + ?3, compute_now())
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, expires_at = excluded.expires_at,
                 renewed_at = excluded.renewed_at,
                 generation = CASE
                     WHEN leases.owner = excluded.owner
                          AND leases.expires_at >= excluded.renewed_at
                     THEN leases.generation ELSE leases.generation + 1 END
             WHERE leases.owner = excluded.owner OR leases.expires_at < excluded.renewed_at
             RETURNING renewed_at, generation",
    )?
    .query_row(params![name, owner, ms(ttl)], |r| {
        Ok(Held {
            name: name.to_string(),
            owner: owner.to_string(),
            now_ms: r.get(0)?,
            generation: r.get::<_, i64>(1)? as u64,
        })
    })
    .optional()?)
}

/// Whether `held` still holds, unexpired: the first statement of a write
/// made under a lease (SQLite runs one write at a time, so it holds until
/// the write commits).
pub(super) fn check_held(c: &Connection, held: &Held) -> Result<(), StoreError> {
    let holds = c
        .prepare_cached(
            "SELECT 1 FROM leases WHERE name = ?1 AND owner = ?2 AND generation = ?3
                 AND expires_at >= compute_now()",
        )?
        .query_row(
            params![held.name, held.owner, held.generation as i64],
            |_| Ok(()),
        )
        .optional()?;
    holds.ok_or_else(|| held.lost())
}

pub(super) fn release(c: &Connection, name: &str, owner: &str) -> Result<(), StoreError> {
    c.execute_kept(
        "DELETE FROM leases WHERE name = ?1 AND owner = ?2",
        params![name, owner],
    )?;
    Ok(())
}

pub(super) fn report_absorption(
    c: &Connection,
    gateway_id: &str,
    per_s: u32,
) -> Result<(), StoreError> {
    c.execute_kept(
        "UPDATE leases SET absorbs_per_s = ?3 WHERE name = ?1 AND owner = ?2",
        params![crate::leases::gateway_lease(gateway_id), gateway_id, per_s],
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
