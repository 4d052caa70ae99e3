//! Leases.

use std::time::Duration;

use super::{Tx, execute, ms, query, query_opt};
use crate::error::StoreError;
use crate::leases::{Held, LeaseRow};

/// Takes a free or expired lease, or renews one `owner` holds; its
/// generation goes up unless `owner` renewed it in time. The conflicting
/// row is locked, so a renewal waits for the Hellos and the controller
/// writes that hold the lease `FOR SHARE`.
pub(super) async fn renew(
    tx: &Tx<'_>,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<Held>, StoreError> {
    Ok(query_opt(
        tx,
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
    .map(|r| Held {
        name: name.to_string(),
        owner: owner.to_string(),
        now_ms: r.get(0),
        generation: r.get::<_, i64>(1) as u64,
    }))
}

/// Whether `held` still holds, unexpired: the first statement of a write
/// made under a lease. The row is kept `FOR SHARE` to the commit, so a
/// takeover (which updates it) waits for the write, and a write after a
/// takeover finds another generation or owner.
pub(super) async fn check_held(tx: &Tx<'_>, held: &Held) -> Result<(), StoreError> {
    query_opt(
        tx,
        "SELECT 1 FROM leases WHERE name = $1 AND owner = $2 AND generation = $3
             AND expires_at >= compute_now() FOR SHARE",
        &[&held.name, &held.owner, &(held.generation as i64)],
    )
    .await?
    .map(|_| ())
    .ok_or_else(|| held.lost())
}

pub(super) async fn release(tx: &Tx<'_>, name: &str, owner: &str) -> Result<(), StoreError> {
    execute(
        tx,
        "DELETE FROM leases WHERE name = $1 AND owner = $2",
        &[&name, &owner],
    )
    .await?;
    Ok(())
}

pub(super) async fn report_absorption(
    tx: &Tx<'_>,
    gateway_id: &str,
    per_s: u32,
) -> Result<(), StoreError> {
    execute(
        tx,
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

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<LeaseRow>, StoreError> {
    Ok(query(
        tx,
        "SELECT name, owner, expires_at, renewed_at FROM leases ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(|r| LeaseRow {
        name: r.get(0),
        owner: r.get(1),
        expires_at_ms: r.get(2),
        renewed_at_ms: r.get(3),
    })
    .collect())
}
