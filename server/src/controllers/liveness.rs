//! The liveness controller: sweeps session states on the store's clock.
//!
//! Sessions of a gateway whose lease expired become disconnected;
//! disconnected nodes unseen for the node lease TTL (plus the gateway-loss
//! grace when their gateway died) become unreachable with a NoSchedule
//! taint and the NodeUnreachable condition; nothing is released. A gap in
//! sweeps holds every timed transition. The rules are
//! `bc_store::liveness`'s, applied inside the sweep's transaction so that
//! several controllers (one per gateway process) agree.

use bc_store::leases::Held;
use bc_store::liveness::LivenessRules;
use bc_store::{GatewayStore, StoreError};
use tracing::{info, warn};

use crate::metrics::ServerMetrics;

/// One sweep; returns whether timed transitions are held now.
pub async fn tick(
    store: &GatewayStore,
    rules: &LivenessRules,
    was_held: bool,
    metrics: &ServerMetrics,
    lease: &Held,
) -> Result<bool, StoreError> {
    let out = metrics
        .timed("sweep_liveness", store.sweep_liveness(rules, lease))
        .await?;
    metrics.transition("disconnected", out.disconnected.len());
    metrics.transition("unreachable", out.unreachable.len());
    match (was_held, out.held) {
        (false, true) => warn!("a liveness sweep gap: holding timed transitions"),
        (true, false) => info!("liveness hold over"),
        _ => {}
    }
    for n in &out.disconnected {
        info!(node = %n, "node disconnected: its gateway's lease expired");
    }
    for n in &out.unreachable {
        info!(node = %n, "node unreachable");
    }
    Ok(out.held)
}
