//! The loops over all of a gateway's sessions.
//!
//! - Liveness: every heartbeat interval (at most 5 s), "seen N ms ago" for
//!   every session goes to the store; sessions the store says a newer Hello
//!   took, and sessions whose certificate ran out, end
//!   ([`super::lifetime::sweep`]).
//! - Revocations: every 250 ms, certificates revoked since the last look
//!   end the sessions that present them, and a newer signed gateway
//!   revocation list goes to every session.
//! - Work: every second, one query finds the sessions with a pending
//!   command or a spec changed since the last look that answered (written
//!   through any gateway) and wakes them; every [`RECONCILE_EVERY`] ticks
//!   it compares the spec generation of every node connected here with the
//!   one its session sent ([`behind`]) and wakes those behind: a change
//!   that committed long after its stamp (a transaction held up, a clock
//!   stepped) goes out then, with no time in the comparison. Every five
//!   seconds, the fleet's size sizes the first-redial window Welcomes
//!   carry.

use bc_store::NodeId;
use std::sync::Arc;
use std::time::Duration;

use bc_store::sessions::Seen;
use tracing::{debug, info, warn};

use super::GatewayState;
use super::lifetime::{self, End, Local};

pub async fn liveness(state: Arc<GatewayState>) {
    let every = state.timing.heartbeat.min(Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if state.is_fenced() {
            continue;
        }
        let (seen, local): (Vec<Seen>, Vec<Local>) = state
            .sessions()
            .iter()
            .map(|(n, s)| {
                let heard = *s.last_heard.lock().unwrap_or_else(|p| p.into_inner());
                (
                    Seen {
                        node_id: n.clone(),
                        epoch: s.epoch,
                        age: heard.elapsed(),
                    },
                    Local {
                        node_id: n.to_string(),
                        epoch: s.epoch,
                        cert_not_after_ms: s.cert_not_after_ms,
                    },
                )
            })
            .unzip();
        if seen.is_empty() {
            continue;
        }
        let gone = match state
            .metrics
            .timed(
                "flush_liveness",
                state.store.flush_liveness(&state.id, &seen),
            )
            .await
        {
            Ok(gone) => gone,
            Err(e) => {
                warn!(error = %e, "liveness flush failed");
                Vec::new()
            }
        };
        for (key, end) in lifetime::sweep(&local, state.clock.now_ms(), &gone) {
            match end {
                End::CertificateExpired => {
                    info!(node = %key.node_id, "certificate expired; closing the session")
                }
                _ => {
                    debug!(node = %key.node_id, epoch = key.epoch, "session superseded; closing it")
                }
            }
            state.end_session(&key.node_id, Some(key.epoch), end);
        }
    }
}

pub async fn revocations(state: Arc<GatewayState>, every: Duration) {
    let mut since = state.clock.now_ms() - 1_000;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match state.store.revoked_since(since).await {
            Ok(rows) => {
                for r in rows {
                    since = since.max(r.at_ms);
                    let mut sessions = state.sessions();
                    if let Some(s) = sessions.get_mut(&r.node_id)
                        && s.cert_serial == r.serial
                        && let Some(tx) = s.end.take()
                    {
                        let _ = tx.send(End::Revoked {
                            reason: r.reason,
                            statement: r.statement,
                        });
                    }
                }
            }
            Err(e) => warn!(error = %e, "revocation feed failed"),
        }
        match state.store.gateway_revocations().await {
            Ok(Some(list)) => state.offer_gateway_revocations(list),
            Ok(None) => {}
            Err(e) => warn!(error = %e, "cannot read the gateway revocation list"),
        }
    }
}

/// Sizes the first-redial window Welcomes and heartbeat acks carry from
/// the fleet's size now and what its gateways measured they absorb
/// ([`super::admission::first_retry_window`]); false when the store could
/// not say (the last figure stays).
pub async fn size_first_retry(state: &GatewayState) -> bool {
    // This gateway's own figure first, on its lease, for everyone's
    // window; a failure leaves the last figure there.
    let absorbs = state.absorbs_per_s();
    state.metrics.absorbs_per_s.set(i64::from(absorbs));
    if let Err(e) = state.store.report_absorption(&state.id, absorbs).await {
        warn!(error = %e, "cannot report what this gateway absorbs");
    }
    match state.store.fleet_size().await {
        Ok(size) => {
            // What the live gateways measured they absorb, together.
            let absorbs = super::admission::fleet_absorbs(
                size.absorbs_per_s,
                size.gateways,
                state.absorption_floor(),
            );
            state.metrics.fleet_absorbs_per_s.set(i64::from(absorbs));
            // What full buckets admit at once, taking every gateway to
            // be configured as this one.
            let burst = size.gateways.max(1) as u64 * u64::from(state.known_burst());
            let window = super::admission::first_retry_window(size.connected, absorbs, burst);
            state.first_retry_ms.store(
                window.as_millis().min(u32::MAX as u128) as u32,
                std::sync::atomic::Ordering::Relaxed,
            );
            true
        }
        Err(e) => {
            warn!(error = %e, "cannot read the fleet's size");
            false
        }
    }
}

/// How far each look for changed specs reaches back before the last look
/// that answered: a change is stamped when its statement runs and seen
/// once it commits. Only how soon a change is seen depends on it: the
/// reconcile finds whatever it missed.
pub const WORK_OVERLAP_MS: i64 = 3_000;
/// Ticks (seconds) between reconciles of the spec generations.
pub const RECONCILE_EVERY: u64 = 5;

/// Where the work loop's look for changed specs starts: the last look that
/// answered (less the overlap), however long ago; the overlap back from
/// now on the first (a session's Hello sends what is newer than its node
/// has). Time is a parameter.
pub fn work_since(now_ms: i64, last_answered_ms: Option<i64>) -> i64 {
    last_answered_ms.unwrap_or(now_ms) - WORK_OVERLAP_MS
}

/// The nodes whose session sent an older generation than the store holds
/// (`sent` says what a node's session sent; `None`: no session here).
pub fn behind(sent: impl Fn(&str) -> Option<u64>, store: &[(NodeId, u64)]) -> Vec<&str> {
    store
        .iter()
        .filter(|(node, generation)| sent(node).is_some_and(|s| s < *generation))
        .map(|(node, _)| node.as_str())
        .collect()
}

pub async fn work(state: Arc<GatewayState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    // When the last look that answered began, on the store's clock.
    let mut answered: Option<i64> = None;
    // When the first-redial window was last sized: the lease keeper sizes
    // it before the gateway admits its first session, then every 5 s here.
    let mut sized_at: Option<u64> = None;
    loop {
        tick.tick().await;
        if sized_at.is_none_or(|at| ticks >= at + 5)
            && !state.is_fenced()
            && size_first_retry(&state).await
        {
            sized_at = Some(ticks);
        }
        ticks += 1;
        if state.is_fenced() || state.sessions().is_empty() {
            continue;
        }
        if ticks.is_multiple_of(RECONCILE_EVERY) {
            match state
                .metrics
                .timed("spec_generations", state.store.spec_generations(&state.id))
                .await
            {
                Ok(generations) => {
                    let woken = state.wake_behind(&generations);
                    if woken > 0 {
                        debug!(woken, "sessions behind the store's spec generation woken");
                    }
                }
                Err(e) => warn!(error = %e, "cannot read the spec generations"),
            }
        }
        // Overlapping looks: a wake for a spec already sent is a no-op.
        let now = state.clock.now_ms();
        let since = work_since(now, answered);
        match state
            .metrics
            .timed(
                "nodes_with_work",
                state.store.nodes_with_work(&state.id, since),
            )
            .await
        {
            Ok(nodes) => {
                answered = Some(now);
                for n in nodes {
                    state.wake(&n);
                }
            }
            Err(e) => warn!(error = %e, "cannot look for pending work"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_look_starts_where_the_last_answered_one_did() {
        let now = 1_000_000;
        assert_eq!(
            work_since(now, None),
            now - WORK_OVERLAP_MS,
            "the first look"
        );
        assert_eq!(work_since(now, Some(now - 1_000)), now - 4_000);
        // Looks that failed for a while: the next reaches back to the last
        // that answered, not just a second.
        assert_eq!(work_since(now, Some(now - 20_000)), now - 23_000);
        assert_eq!(work_since(now, Some(now - 600_000)), now - 603_000);
    }

    #[test]
    fn a_session_behind_the_store_is_found_whatever_the_stamps() {
        let store = vec![
            (NodeId::from("a"), 3),
            (NodeId::from("b"), 5),
            (NodeId::from("c"), 1),
            (NodeId::from("gone"), 9),
        ];
        let sent = |n: &str| match n {
            "a" => Some(3),
            "b" => Some(4),
            "c" => Some(2),
            _ => None,
        };
        // b is behind; a has it; c has newer (its node said so at its
        // Hello); "gone" has no session here.
        assert_eq!(behind(sent, &store), vec!["b"]);
        assert!(behind(|_| Some(u64::MAX), &store).is_empty());
        assert_eq!(behind(|_| Some(0), &store).len(), 4);
    }
}
