//! Table leases: each controller runs in one process at a time.
//!
//! A controller's lease (`controller:<name>`, 15 s by default) is renewed
//! every third of its TTL by whichever process holds it; the others try to
//! take it at the same pace and run nothing meanwhile. A holder that dies
//! stops renewing: its lease runs out and the next process to try takes
//! it over. Nothing a controller decides is lost with its holder: each
//! pass starts from the store (commands pending, rollouts running, the
//! liveness sweep's last time), so a takeover carries on where it stopped.
//!
//! A holder that cannot renew stops working after half the TTL, well
//! before the lease can run out on the store's clock and pass to another.

use std::time::Duration;

use bc_store::GatewayStore;
use bc_store::leases::Held;
use tokio::time::Instant;
use tracing::{info, warn};

/// The default TTL of a controller's lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// The lease controller `name` holds while it runs.
pub fn lease_name(name: &str) -> String {
    format!("controller:{name}")
}

/// What a renewal attempt came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Held,
    Taken,
    Failed,
}

/// Whether the controller may run, from the last renewal and the time since
/// the last good one (`None`: never held).
pub fn may_run(r: Renewal, since_last_ok: Option<Duration>, ttl: Duration) -> bool {
    match r {
        Renewal::Held => true,
        Renewal::Taken => false,
        Renewal::Failed => since_last_ok.is_some_and(|d| d < ttl / 2),
    }
}

/// One process's hold on one controller's lease.
#[derive(Debug)]
pub struct Holder {
    store: GatewayStore,
    name: String,
    owner: String,
    ttl: Duration,
    last_try: Option<Instant>,
    last_ok: Option<Instant>,
    /// The lease as last held: what the controller's writes name.
    held: Option<Held>,
    running: bool,
}

impl Holder {
    pub fn new(store: GatewayStore, controller: &str, owner: &str, ttl: Duration) -> Holder {
        Holder {
            store,
            name: lease_name(controller),
            owner: owner.to_string(),
            ttl,
            last_try: None,
            last_ok: None,
            held: None,
            running: false,
        }
    }

    /// Renews or takes the lease when a third of the TTL has passed since
    /// the last try; answers the lease as held when the controller may run
    /// now (its writes name it: the store takes them only while it holds).
    pub async fn may_run(&mut self) -> Option<Held> {
        let every = self.ttl / 3;
        if self.last_try.is_some_and(|t| t.elapsed() < every) {
            let run = self.running && self.last_ok.is_some_and(|t| t.elapsed() < self.ttl / 2);
            return self.held.clone().filter(|_| run);
        }
        self.last_try = Some(Instant::now());
        let renewal = match tokio::time::timeout(
            every,
            self.store.hold_lease(&self.name, &self.owner, self.ttl),
        )
        .await
        {
            Ok(Ok(Some(held))) => {
                if self
                    .held
                    .as_ref()
                    .is_some_and(|h| h.generation != held.generation)
                {
                    info!(lease = %self.name, generation = held.generation, "the controller lease was taken again after it lapsed");
                }
                self.held = Some(held);
                Renewal::Held
            }
            Ok(Ok(None)) => Renewal::Taken,
            Ok(Err(e)) => {
                warn!(lease = %self.name, error = %e, "controller lease renewal failed");
                Renewal::Failed
            }
            Err(_) => {
                warn!(lease = %self.name, "controller lease renewal timed out");
                Renewal::Failed
            }
        };
        if renewal == Renewal::Held {
            self.last_ok = Some(Instant::now());
        }
        let run = may_run(renewal, self.last_ok.map(|t| t.elapsed()), self.ttl);
        if run != self.running {
            if run {
                info!(lease = %self.name, owner = %self.owner, "holding the controller lease; running it");
            } else {
                info!(lease = %self.name, owner = %self.owner, "not holding the controller lease; another process runs it");
            }
            self.running = run;
        }
        self.held.clone().filter(|_| run)
    }

    /// Gives the lease up (an orderly stop), so another process takes it
    /// at once rather than after the TTL.
    pub async fn release(&self) {
        if self.running
            && let Err(e) = self.store.release_lease(&self.name, &self.owner).await
        {
            warn!(lease = %self.name, error = %e, "cannot release the controller lease");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(15);

    #[test]
    fn a_held_lease_runs_and_a_taken_one_does_not() {
        assert!(may_run(Renewal::Held, None, TTL));
        assert!(!may_run(Renewal::Taken, Some(Duration::ZERO), TTL));
    }

    #[test]
    fn a_holder_that_cannot_renew_stops_before_the_lease_can_pass() {
        assert!(may_run(Renewal::Failed, Some(Duration::from_secs(7)), TTL));
        assert!(!may_run(
            Renewal::Failed,
            Some(Duration::from_millis(7_500)),
            TTL
        ));
        assert!(!may_run(Renewal::Failed, None, TTL), "never held");
    }
}
