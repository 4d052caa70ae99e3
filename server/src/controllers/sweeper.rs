//! The sweeper: commands still pending after their deadline expire
//! (`not_after passed before dispatch`); a command a node may hold is never
//! swept: the node itself rejects it EXPIRED on server time. Leases dead
//! past the gateway-loss grace (their holder is gone) are removed, as every
//! start's reconcile does.

use std::time::Duration;

use bc_store::leases::Held;
use bc_store::reconcile::HistoryLimits;
use bc_store::{CommandId, GatewayStore, Store, StoreError};
use tracing::info;

/// One sweep; returns the commands it expired.
pub async fn tick(
    store: &GatewayStore,
    dead_lease_after: Duration,
    lease: &Held,
) -> Result<Vec<CommandId>, StoreError> {
    let expired = store.sweep_commands(lease).await?;
    for id in &expired {
        info!(cmd = %id, "command expired before dispatch");
    }
    for lease in store.remove_dead_leases(dead_lease_after, lease).await? {
        info!(%lease, "removed a lease its holder left behind");
    }
    Ok(expired)
}

/// How often the history controller prunes history where peers add rows.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Removes the oldest security events and boot records past the limits:
/// the key holder's work (the history controller), never a gateway's,
/// whose database role may not delete a security record.
pub async fn prune(store: &Store, lease: &Held) -> Result<(), StoreError> {
    let p = store.prune_history(HistoryLimits::default(), lease).await?;
    if p.fleet_events + p.boots > 0 {
        info!(
            fleet_events = p.fleet_events,
            boots = p.boots,
            "pruned the oldest history past its limits"
        );
    }
    Ok(())
}
