//! Controllers: loops that move the fleet toward what the store says.
//!
//! Each is a pure decision, the store methods it reads and writes through,
//! and a `tick` that does one pass; the loops here run the ticks.
//!
//! - [`liveness`]: session states on the store's clock (its rules are
//!   `bc_store::liveness`, applied inside the sweep's transaction).
//! - [`sweeper`]: commands still pending past their deadline.
//! - [`rollouts`]: releases in waves.
//! - [`specs`]: specs signed again before they expire.

pub mod liveness;
pub mod rollouts;
pub mod specs;
pub mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use bc_store::Store;
use bc_store::liveness::LivenessRules;
use tracing::warn;

use crate::api::Wake;

/// The liveness controller and the command sweeper, every `every`.
pub async fn run_liveness(store: Store, rules: LivenessRules, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut held = false;
    loop {
        tick.tick().await;
        match liveness::tick(&store, &rules, held).await {
            Ok(now_held) => held = now_held,
            Err(e) => warn!(error = %e, "liveness sweep failed"),
        }
        if let Err(e) = sweeper::tick(&store).await {
            warn!(error = %e, "command sweep failed");
        }
    }
}

/// The rollout controller: every second, or at once when an operator
/// starts or changes a rollout (`wake`). Nodes given a command are woken
/// through `gateway`.
pub async fn run_rollouts(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    gateway: Arc<dyn Wake>,
    wake: Arc<tokio::sync::Notify>,
) {
    loop {
        match rollouts::tick(&store, &key).await {
            Ok(woken) => {
                for n in woken {
                    gateway.wake(&n);
                }
            }
            Err(e) => warn!(error = %e, "rollout pass failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = wake.notified() => {}
        }
    }
}

/// How often specs are looked at for signing again.
const SPECS_EVERY: Duration = Duration::from_secs(60);

/// The spec controller: every minute, specs that expire soon are signed
/// again; their nodes are woken through `gateway`.
pub async fn run_specs(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    gateway: Arc<dyn Wake>,
) {
    let mut tick = tokio::time::interval(SPECS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match specs::tick(&store, &key).await {
            Ok(renewed) => {
                for n in renewed {
                    gateway.wake(&n);
                }
            }
            Err(e) => warn!(error = %e, "spec signing pass failed"),
        }
    }
}
