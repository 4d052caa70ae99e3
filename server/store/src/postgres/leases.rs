//! Leases.

use std::time::Duration;

use super::{Tx, execute, ms, query, query_opt};
use crate::error::StoreError;
use crate::leases::LeaseRow;

/// Takes a free or expired lease, or renews one `owner` holds; the
/// conflicting row is locked, so a renewal waits for the Hellos that hold
/// the lease `FOR SHARE`.
pub(super) async fn renew(
    tx: &Tx<'_>,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<i64>, StoreError> {
    Ok(query_opt(
        tx,
        "INSERT INTO leases (name, owner, expires_at, renewed_at)
             VALUES ($1, $2, compute_now() + $3, compute_now())
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, expires_at = excluded.expires_at,
                 renewed_at = excluded.renewed_at
             WHERE leases.owner = excluded.owner OR leases.expires_at < excluded.renewed_at
             RETURNING renewed_at",
        &[&name, &owner, &ms(ttl)],
    )
    .await?
    .map(|r| r.get(0)))
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
