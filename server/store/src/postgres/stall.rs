//! The simulated stall (the audit history: `crate::sql::audit`).

use std::time::Duration;

use super::Tx;
use crate::error::StoreError;

/// Holds a lock on the fleet's tables that lets readers through and makes
/// every writer wait (or fail after its lock timeout), as a stalled
/// database does.
pub(super) async fn stall(tx: &Tx<'_>, duration: Duration) -> Result<(), StoreError> {
    tx.batch_execute(
        "SET LOCAL lock_timeout = 0;
         LOCK TABLE leases, nodes, node_sessions, commands, node_state, node_specs, inventory,
             node_events, bindings, audit IN EXCLUSIVE MODE",
    )
    .await?;
    tx.execute("SELECT pg_sleep($1)", &[&duration.as_secs_f64()])
        .await?;
    Ok(())
}
