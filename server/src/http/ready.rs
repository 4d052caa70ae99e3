//! Readiness: whether this process should be sent traffic. Ready only when
//! start-up is done, the store answered the last probe within its bound
//! with every migration applied, and the gateway holds its lease (is not
//! fenced). [`verdict`] decides from those facts without I/O; [`probe`]
//! refreshes the store's part every second, so a load balancer polling
//! `/readyz` never queues calls on the store.
//!
//! What a not-ready answer names is fixed text: never an address, SQL or a
//! driver's words.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bc_store::StoreError;

/// How often the store is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one probe may take before the store counts as unreachable.
pub const PROBE_BOUND: Duration = Duration::from_secs(2);

/// What the last store probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreState {
    /// No probe has answered yet.
    Unknown,
    Ready,
    /// It failed or did not answer within [`PROBE_BOUND`].
    Unreachable,
    /// Fewer migrations applied than this binary writes.
    Behind {
        found: u32,
        want: u32,
    },
    /// More than this binary knows.
    Newer {
        found: u32,
        want: u32,
    },
}

impl StoreState {
    /// From a probe's answer.
    pub fn from_probe(answer: Option<Result<u32, &StoreError>>, want: u32) -> StoreState {
        match answer {
            Some(Ok(found)) if found == want => StoreState::Ready,
            Some(Ok(found)) if found < want => StoreState::Behind { found, want },
            Some(Ok(found)) => StoreState::Newer { found, want },
            Some(Err(_)) | None => StoreState::Unreachable,
        }
    }
}

/// Why the process is not ready; empty when it is.
pub fn verdict(started: bool, store: StoreState, lease_held: Option<bool>) -> Vec<String> {
    let mut why = Vec::new();
    if !started {
        why.push("start-up: reconcile and listeners not finished".to_string());
    }
    match store {
        StoreState::Ready => {}
        StoreState::Unknown => why.push("store: not probed yet".into()),
        StoreState::Unreachable => why.push("store: unreachable".into()),
        StoreState::Behind { found, want } => why.push(format!(
            "store: migrations not applied (schema {found} of {want})"
        )),
        StoreState::Newer { found, want } => why.push(format!(
            "store: schema {found} is newer than this binary's {want}"
        )),
    }
    match lease_held {
        Some(true) => {}
        Some(false) => why.push("gateway lease: not held (fenced)".into()),
        None => why.push("gateway lease: not taken yet".into()),
    }
    why
}

/// Whether the gateway holds its lease now.
pub type LeaseHeld = Box<dyn Fn() -> bool + Send + Sync>;

/// Whether an operator drains the gateway now (`gateways drain`).
pub type Draining = Box<dyn Fn() -> bool + Send + Sync>;

/// The facts [`verdict`] reads, shared by the process's parts.
#[derive(Default)]
pub struct Readiness {
    started: AtomicBool,
    store: Mutex<Option<StoreState>>,
    lease: OnceLock<LeaseHeld>,
    draining: OnceLock<Draining>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("started", &self.started.load(Ordering::Relaxed))
            .field("store", &self.store_state())
            .finish_non_exhaustive()
    }
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness::default()
    }

    /// Start-up is done: listeners bound, lease taken, loops running.
    pub fn started(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// How to tell whether the gateway holds its lease (set once).
    pub fn watch_lease(&self, held: LeaseHeld) {
        let _ = self.lease.set(held);
    }

    /// How to tell whether the gateway is draining (set once).
    pub fn watch_draining(&self, draining: Draining) {
        let _ = self.draining.set(draining);
    }

    pub fn set_store(&self, s: StoreState) {
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }

    pub fn store_state(&self) -> StoreState {
        self.store
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(StoreState::Unknown)
    }

    /// Why not ready now; empty when ready.
    pub fn why_not(&self) -> Vec<String> {
        let mut why = verdict(
            self.started.load(Ordering::SeqCst),
            self.store_state(),
            self.lease.get().map(|held| held()),
        );
        if self.draining.get().is_some_and(|d| d()) {
            why.push(
                "gateway: draining (better-compute gateways undrain ID takes sessions again)"
                    .into(),
            );
        }
        why
    }
}

/// Probes the store every [`PROBE_EVERY`] for as long as it runs: its
/// schema version, read within [`PROBE_BOUND`], against `want`.
pub async fn probe(store: bc_store::GatewayStore, want: u32, readiness: Arc<Readiness>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let answer = tokio::time::timeout(PROBE_BOUND, store.schema_version()).await;
        let state = match &answer {
            Ok(Ok(v)) => StoreState::from_probe(Some(Ok(*v)), want),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "readiness: the store probe failed");
                StoreState::from_probe(Some(Err(e)), want)
            }
            Err(_) => StoreState::from_probe(None, want),
        };
        readiness.set_store(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_fact_holds() {
        assert!(verdict(true, StoreState::Ready, Some(true)).is_empty());
        assert_eq!(
            verdict(false, StoreState::Ready, Some(true)),
            ["start-up: reconcile and listeners not finished"]
        );
        assert_eq!(
            verdict(true, StoreState::Unreachable, Some(false)),
            ["store: unreachable", "gateway lease: not held (fenced)"]
        );
        assert_eq!(
            verdict(true, StoreState::Behind { found: 3, want: 11 }, Some(true)),
            ["store: migrations not applied (schema 3 of 11)"]
        );
        assert_eq!(
            verdict(true, StoreState::Unknown, None),
            ["store: not probed yet", "gateway lease: not taken yet"]
        );
    }

    #[test]
    fn a_probe_answer_is_a_store_state() {
        let e = StoreError::Missing;
        assert_eq!(StoreState::from_probe(Some(Ok(11)), 11), StoreState::Ready);
        assert_eq!(
            StoreState::from_probe(Some(Ok(12)), 11),
            StoreState::Newer {
                found: 12,
                want: 11
            }
        );
        assert_eq!(
            StoreState::from_probe(Some(Err(&e)), 11),
            StoreState::Unreachable
        );
        assert_eq!(StoreState::from_probe(None, 11), StoreState::Unreachable);
    }

    #[test]
    fn the_lease_is_read_when_asked() {
        let r = Readiness::new();
        r.started();
        r.set_store(StoreState::Ready);
        assert_eq!(r.why_not(), ["gateway lease: not taken yet"]);
        let held = Arc::new(AtomicBool::new(true));
        let h = held.clone();
        r.watch_lease(Box::new(move || h.load(Ordering::SeqCst)));
        let draining = Arc::new(AtomicBool::new(false));
        let d = draining.clone();
        r.watch_draining(Box::new(move || d.load(Ordering::SeqCst)));
        assert!(r.why_not().is_empty());
        held.store(false, Ordering::SeqCst);
        assert_eq!(r.why_not(), ["gateway lease: not held (fenced)"]);
        held.store(true, Ordering::SeqCst);
        draining.store(true, Ordering::SeqCst);
        assert_eq!(
            r.why_not(),
            ["gateway: draining (better-compute gateways undrain ID takes sessions again)"]
        );
    }
}
