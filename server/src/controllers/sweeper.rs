//! The command sweeper: commands still pending after their deadline
//! expire (`not_after passed before dispatch`). A command a node may hold
//! is never swept: the node itself rejects it EXPIRED on server time.

use bc_store::{Store, StoreError};
use tracing::info;

/// One sweep; returns the commands it expired.
pub async fn tick(store: &Store) -> Result<Vec<String>, StoreError> {
    let expired = store.sweep_commands().await?;
    for id in &expired {
        info!(cmd = %id, "command expired before dispatch");
    }
    Ok(expired)
}
