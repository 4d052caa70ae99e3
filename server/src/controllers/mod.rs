//! Controllers: loops that move the fleet toward what the store says.
//!
//! Each is a pure decision, the store methods it reads and writes through,
//! and a `tick` that does one pass; the loops here run the ticks, each in
//! one process at a time: the one holding the controller's table lease
//! ([`lease`]), so N gateway processes do not each sweep.
//!
//! - [`liveness`]: session states on the store's clock (its rules are
//!   `bc_store::liveness`, applied inside the sweep's transaction).
//! - [`sweeper`]: commands still pending past their deadline; on the key
//!   holder only, history pruned past its limits (`run_history`).
//! - [`rollouts`]: releases in waves.
//! - [`specs`]: specs signed again before they expire.
//! - [`clones`]: on the key holder, sightings verified; older certificates
//!   superseded and cloned identities quarantined from the nodes' proofs.
//! - [`gateway_revocations`]: on the key holder, the signed list of revoked
//!   gateway certificates nodes are handed.
//! - [`receipts`]: on the key holder, receipts for the results nodes
//!   signed, so nodes forget only what the store holds.

pub mod clones;
pub mod gateway_revocations;
pub mod lease;
pub mod liveness;
pub mod receipts;
pub mod rollouts;
pub mod specs;
pub mod sweeper;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bc_store::liveness::LivenessRules;
use bc_store::{GatewayStore, Store};
use tracing::warn;

use crate::api::Wake;

/// Which process runs the controllers: its owner name on their leases,
/// and their TTL.
#[derive(Debug, Clone)]
pub struct Leases {
    pub owner: String,
    pub ttl: Duration,
}

/// Runs `pass` every `every` while this process holds `controller`'s
/// lease, until `stop` fires; then gives the lease up. `pass` is handed
/// the lease as held, which its store writes name, so that a pass that
/// outlived its lease writes nothing.
async fn under_lease<F, Fut>(
    store: GatewayStore,
    controller: &str,
    leases: Leases,
    every: Duration,
    wake: Option<Arc<tokio::sync::Notify>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut pass: F,
) where
    F: FnMut(bc_store::leases::Held) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut holder = lease::Holder::new(store, controller, &leases.owner, leases.ttl);
    loop {
        if let Some(held) = holder.may_run().await {
            pass(held).await;
        }
        let woken = async {
            match &wake {
                Some(w) => w.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = woken => {}
            _ = stopped(&mut stop) => {
                holder.release().await;
                return;
            }
        }
    }
}

/// Resolves once `stop` says so.
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard wait_for answers with is dropped here, not held across
    // the caller's awaits.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// The liveness controller, every `every`.
pub async fn run_liveness(
    store: GatewayStore,
    rules: LivenessRules,
    every: Duration,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<crate::metrics::ServerMetrics>,
) {
    // Whether timed transitions were held at the last pass (for the log).
    let held = Arc::new(AtomicBool::new(false));
    let s = store.clone();
    under_lease(store, "liveness", leases, every, None, stop, |lease| {
        let (s, held, metrics) = (s.clone(), held.clone(), metrics.clone());
        async move {
            match liveness::tick(&s, &rules, held.load(Ordering::Relaxed), &metrics, &lease).await {
                Ok(now_held) => held.store(now_held, Ordering::Relaxed),
                Err(e) => warn!(error = %e, "liveness sweep failed"),
            }
        }
    })
    .await
}

/// The command sweeper, every `every`.
pub async fn run_sweeper(
    store: GatewayStore,
    every: Duration,
    dead_lease_after: Duration,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    under_lease(store, "sweeper", leases, every, None, stop, |lease| {
        let s = s.clone();
        async move {
            if let Err(e) = sweeper::tick(&s, dead_lease_after, &lease).await {
                warn!(error = %e, "sweep failed");
            }
        }
    })
    .await
}

/// The history controller, on the key holder: every
/// [`sweeper::PRUNE_EVERY`], the oldest security events and boot records
/// past their limits go.
pub async fn run_history(store: Store, leases: Leases, stop: tokio::sync::watch::Receiver<bool>) {
    let s = store.clone();
    under_lease(
        store.gateway(),
        "history",
        leases,
        sweeper::PRUNE_EVERY,
        None,
        stop,
        |lease| {
            let s = s.clone();
            async move {
                if let Err(e) = sweeper::prune(&s, &lease).await {
                    warn!(error = %e, "pruning history failed");
                }
            }
        },
    )
    .await
}

/// The rollout controller: every second, or at once when an operator
/// starts or changes a rollout through this process (`wake`; an operator
/// on another process is seen within the second). Nodes given a command
/// are woken through `gateway` (those on other gateways by their own
/// work feed).
pub async fn run_rollouts(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    ca_der: Arc<Vec<u8>>,
    gateway: Arc<dyn Wake>,
    wake: Arc<tokio::sync::Notify>,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    let believed = Arc::new(rollouts::Believed::new(ca_der));
    under_lease(
        store.gateway(),
        "rollouts",
        leases,
        Duration::from_secs(1),
        Some(wake),
        stop,
        |lease| {
            let (s, key, gateway, believed) =
                (s.clone(), key.clone(), gateway.clone(), believed.clone());
            async move {
                match rollouts::tick(&s, &key, &believed, &lease).await {
                    Ok(woken) => {
                        for n in woken {
                            gateway.wake(&n);
                        }
                    }
                    Err(e) => warn!(error = %e, "rollout pass failed"),
                }
            }
        },
    )
    .await
}

/// The clone watch, on the key holder: every `every`.
pub async fn run_clones(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    ca_der: Arc<Vec<u8>>,
    every: Duration,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    let watch = Arc::new(tokio::sync::Mutex::new(clones::Watch::new(ca_der)));
    under_lease(store.gateway(), "clones", leases, every, None, stop, |_| {
        let (s, key, watch) = (s.clone(), key.clone(), watch.clone());
        async move {
            if let Err(e) = watch.lock().await.tick(&s, &key).await {
                warn!(error = %e, "clone watch pass failed");
            }
        }
    })
    .await
}

/// How often specs are looked at for signing again.
const SPECS_EVERY: Duration = Duration::from_secs(60);

/// The spec controller: every minute, specs that expire soon are signed
/// again; their nodes are woken through `gateway` (those on other
/// gateways by their own work feed).
pub async fn run_specs(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    tickets: Arc<crate::pki::tickets::TicketKey>,
    gateway: Arc<dyn Wake>,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    under_lease(
        store.gateway(),
        "specs",
        leases,
        SPECS_EVERY,
        None,
        stop,
        |_| {
            let (s, key, tickets, gateway) =
                (s.clone(), key.clone(), tickets.clone(), gateway.clone());
            async move {
                match specs::tick(&s, &key, &tickets).await {
                    Ok(renewed) => {
                        for n in renewed {
                            gateway.wake(&n);
                        }
                    }
                    Err(e) => warn!(error = %e, "spec signing pass failed"),
                }
            }
        },
    )
    .await
}

/// The gateway revocation list, on the key holder: signed again every
/// tenth of its life, or at once when an operator revokes a gateway
/// through this process (`wake`).
pub async fn run_gateway_revocations(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    life: Duration,
    wake: Arc<tokio::sync::Notify>,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    let named = Arc::new(std::sync::Mutex::new(None::<usize>));
    under_lease(
        store.gateway(),
        "gateway-revocations",
        leases,
        gateway_revocations::every(life),
        Some(wake),
        stop,
        |_| {
            let (s, key, named) = (s.clone(), key.clone(), named.clone());
            async move {
                match gateway_revocations::tick(&s, &key, life).await {
                    Ok(n) => {
                        let mut last = named.lock().unwrap_or_else(|p| p.into_inner());
                        gateway_revocations::log_change(*last, n);
                        *last = Some(n);
                    }
                    Err(e) => warn!(error = %e, "cannot sign the gateway revocation list"),
                }
            }
        },
    )
    .await
}

/// How often stored results are judged for receipts.
pub const RECEIPTS_EVERY: Duration = Duration::from_millis(500);

/// The receipt controller, on the key holder: every [`RECEIPTS_EVERY`].
pub async fn run_receipts(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    ca_der: Arc<Vec<u8>>,
    leases: Leases,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let s = store.clone();
    under_lease(
        store.gateway(),
        "receipts",
        leases,
        RECEIPTS_EVERY,
        None,
        stop,
        |_| {
            let (s, key, ca_der) = (s.clone(), key.clone(), ca_der.clone());
            async move {
                if let Err(e) = receipts::tick(&s, &key, &ca_der).await {
                    warn!(error = %e, "receipt pass failed");
                }
                if let Err(e) = receipts::tick_events(&s, &key).await {
                    warn!(error = %e, "event receipt pass failed");
                }
                if let Err(e) = receipts::tick_unknown(&s, &key, &ca_der).await {
                    warn!(error = %e, "unknown result receipt pass failed");
                }
            }
        },
    )
    .await
}
