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
//!   through any gateway) and wakes them; every [`WORK_LOOK_BACK_EVERY`]
//!   ticks it looks back [`WORK_LOOK_BACK`], the sessions' safety net for
//!   a change that committed long after it was stamped. Every five
//!   seconds, the fleet's size sizes the first-redial window Welcomes
//!   carry.

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
                        node_id: n.clone(),
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
/// the fleet's size now ([`super::admission::first_retry_window`]); false
/// when the store could not say (the last figure stays).
pub async fn size_first_retry(state: &GatewayState) -> bool {
    match state.store.fleet_size().await {
        Ok(size) => {
            let per_gateway = state.timing.hello_capacity.min(state.timing.handshake_rate);
            let window =
                super::admission::first_retry_window(size.connected, size.gateways, per_gateway);
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
/// once it commits.
pub const WORK_OVERLAP_MS: i64 = 3_000;
/// The work loop's wider look, every [`WORK_LOOK_BACK_EVERY`] ticks.
pub const WORK_LOOK_BACK: Duration = Duration::from_secs(60);
pub const WORK_LOOK_BACK_EVERY: u64 = 30;

/// Where the work loop's look for changed specs starts: the last look that
/// answered (less the overlap), however long ago, and at least
/// [`WORK_LOOK_BACK`] back on the wider looks and the first. Time is a
/// parameter.
pub fn work_since(now_ms: i64, last_answered_ms: Option<i64>, tick: u64) -> i64 {
    let wide = now_ms - WORK_LOOK_BACK.as_millis() as i64;
    match last_answered_ms {
        Some(last) if !tick.is_multiple_of(WORK_LOOK_BACK_EVERY) => last - WORK_OVERLAP_MS,
        Some(last) => (last - WORK_OVERLAP_MS).min(wide),
        None => wide,
    }
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
        // Overlapping looks: a wake for a spec already sent is a no-op.
        let now = state.clock.now_ms();
        let since = work_since(now, answered, ticks);
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
    fn the_work_look_starts_where_the_last_answered_one_did_and_widens_now_and_then() {
        let now = 1_000_000;
        let wide = now - WORK_LOOK_BACK.as_millis() as i64;
        assert_eq!(work_since(now, None, 1), wide, "the first look");
        assert_eq!(work_since(now, Some(now - 1_000), 1), now - 4_000);
        // Looks that failed for a while: the next reaches back to the last
        // that answered, not just a second.
        assert_eq!(work_since(now, Some(now - 20_000), 7), now - 23_000);
        assert_eq!(work_since(now, Some(now - 600_000), 7), now - 603_000);
        // The wider look reaches at least its span back.
        assert_eq!(
            work_since(now, Some(now - 1_000), WORK_LOOK_BACK_EVERY),
            wide
        );
        assert_eq!(work_since(now, Some(now - 1_000), 0), wide);
        assert_eq!(work_since(now, Some(now - 600_000), 0), now - 603_000);
    }
}
