//! The gateway's lease, `gateway:<id>`: renewed every quarter TTL on a
//! connection of its own (so renewals never wait behind Hellos). Without a
//! renewal for half the TTL, or on finding another owner, the gateway
//! fences itself: it closes every stream UNAVAILABLE and refuses new ones
//! until it holds the lease again. Each renewal anchors the gateway's
//! clock to the store's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::GatewayState;

/// What a renewal attempt came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Held; the store's now.
    Held(i64),
    /// Another owner holds it, unexpired.
    Taken,
    /// The store failed or did not answer in time.
    Failed,
}

/// What the gateway does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Holding: anchor the clock to the store's now, admit sessions.
    Hold(i64),
    Fence(&'static str),
    /// Not fenced yet: retry at the next tick.
    Wait,
}

/// Decides from a renewal and the time since the last good one (`None`:
/// never renewed).
pub fn decide(r: Renewal, since_last_ok: Option<Duration>, ttl: Duration) -> Action {
    match r {
        Renewal::Held(now) => Action::Hold(now),
        Renewal::Taken => Action::Fence("another owner holds the gateway lease"),
        Renewal::Failed if since_last_ok.is_none_or(|d| d >= ttl / 2) => {
            Action::Fence("no lease renewal for half the lease TTL")
        }
        Renewal::Failed => Action::Wait,
    }
}

/// Keeps the lease for as long as the gateway runs.
pub async fn keep(state: Arc<GatewayState>) {
    let ttl = state.timing.gateway_lease_ttl;
    let mut last_ok: Option<Instant> = None;
    let mut tick = tokio::time::interval(ttl / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let name = state.lease_name();
    loop {
        tick.tick().await;
        let renewal =
            match tokio::time::timeout(ttl / 2, state.store.renew_lease(&name, &state.id, ttl))
                .await
            {
                Ok(Ok(Some(now))) => Renewal::Held(now),
                Ok(Ok(None)) => Renewal::Taken,
                Ok(Err(e)) => {
                    warn!(error = %e, "gateway lease renewal failed");
                    Renewal::Failed
                }
                Err(_) => {
                    warn!("gateway lease renewal timed out");
                    Renewal::Failed
                }
            };
        match decide(renewal, last_ok.map(|t| t.elapsed()), ttl) {
            Action::Hold(now) => {
                state.clock.anchor(now);
                last_ok = Some(Instant::now());
                if !state.stopping.load(Ordering::SeqCst)
                    && state.fenced.swap(false, Ordering::SeqCst)
                {
                    info!(gateway = %state.id, "holding the gateway lease; admitting sessions");
                }
            }
            Action::Fence(why) => state.fence(why),
            Action::Wait => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(20);

    #[test]
    fn a_held_lease_anchors_the_clock() {
        assert_eq!(decide(Renewal::Held(5), None, TTL), Action::Hold(5));
    }

    #[test]
    fn another_owner_fences_at_once() {
        assert!(matches!(
            decide(Renewal::Taken, Some(Duration::ZERO), TTL),
            Action::Fence(_)
        ));
    }

    #[test]
    fn failures_fence_after_half_the_ttl_without_a_renewal() {
        assert_eq!(
            decide(Renewal::Failed, Some(Duration::from_millis(9_999)), TTL),
            Action::Wait
        );
        assert!(matches!(
            decide(Renewal::Failed, Some(Duration::from_secs(10)), TTL),
            Action::Fence("no lease renewal for half the lease TTL")
        ));
        assert!(
            matches!(decide(Renewal::Failed, None, TTL), Action::Fence(_)),
            "never held: fenced"
        );
    }
}
