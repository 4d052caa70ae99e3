//! Leases.

use crate::id::GatewayId;
use std::time::Duration;

use super::Db;
use crate::clock::ms;
use crate::error::StoreError;
use crate::leases::{Held, LeaseRow};

/// Takes a free or expired lease, or renews one `owner` holds; its
/// generation goes up unless `owner` renewed it in time. On PostgreSQL
/// the conflicting row is locked, so a renewal waits for the Hellos and
/// the controller writes that hold the lease `FOR SHARE`.
pub(crate) async fn renew(
    db: &impl Db,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<Held>, StoreError> {
    db.query_opt(
        "INSERT INTO leases (name, owner, expires_at, renewed_at)
             VALUES ($1, $2, compute_now() + $3, compute_now())
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, expires_at = excluded.expires_at,
                 renewed_at = excluded.renewed_at,
                 generation = CASE
                     WHEN leases.owner = excluded.owner
                          AND leases.expires_at >= excluded.renewed_at
                     THEN leases.generation ELSE leases.generation + 1 END
             WHERE leases.owner = excluded.owner OR leases.expires_at < excluded.renewed_at
             RETURNING renewed_at, generation",
        &[&name, &owner, &ms(ttl)],
    )
    .await?
    .map(|r| {
        Ok(Held {
            name: name.to_string(),
            owner: owner.to_string(),
            now_ms: r.get(0)?,
            generation: r.get::<i64>(1)? as u64,
        })
    })
    .transpose()
}

/// Whether `held` still holds, unexpired: the first statement of a write
/// made under a lease. On SQLite it holds until the write commits (one
/// write runs at a time); on PostgreSQL the row is kept `FOR SHARE` to the
/// commit, so a takeover (which updates it) waits for the write, and a
/// write after a takeover finds another generation or owner.
pub(crate) async fn check_held(db: &impl Db, held: &Held) -> Result<(), StoreError> {
    db.query_opt(
        "SELECT 1 FROM leases WHERE name = $1 AND owner = $2 AND generation = $3
             AND expires_at >= compute_now() FOR SHARE",
        &[&held.name, &held.owner, &(held.generation as i64)],
    )
    .await?
    .map(|_| ())
    .ok_or_else(|| held.lost())
}

pub(crate) async fn release(db: &impl Db, name: &str, owner: &str) -> Result<(), StoreError> {
    db.execute(
        "DELETE FROM leases WHERE name = $1 AND owner = $2",
        &[&name, &owner],
    )
    .await?;
    Ok(())
}

pub(crate) async fn report_absorption(
    db: &impl Db,
    gateway_id: &GatewayId,
    per_s: u32,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE leases SET absorbs_per_s = $3 WHERE name = $1 AND owner = $2",
        &[
            &crate::leases::gateway_lease(gateway_id),
            &gateway_id,
            &i64::from(per_s),
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<LeaseRow>, StoreError> {
    db.query(
        "SELECT name, owner, expires_at, renewed_at FROM leases ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(LeaseRow {
            name: r.get(0)?,
            owner: r.get(1)?,
            expires_at_ms: r.get(2)?,
            renewed_at_ms: r.get(3)?,
        })
    })
    .collect()
}
