//! Leases.

use std::time::Duration;

use super::{Tx, execute, ms, query_opt};
use crate::error::StoreError;

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
