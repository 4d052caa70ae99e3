//! The loops over all of a gateway's sessions.
//!
//! - Liveness: every heartbeat interval (at most 5 s), "seen N ms ago" for
//!   every session goes to the store; sessions the store says a newer Hello
//!   took, and sessions whose certificate ran out, end
//!   ([`super::lifetime::sweep`]).
//! - Revocations: every 250 ms, certificates revoked since the last look
//!   end the sessions that present them.
//! - Work: every second, one query finds the sessions with a pending
//!   command or a changed spec (written through any gateway) and wakes
//!   them; every five, the fleet's size sizes the first-redial window
//!   Welcomes carry.

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

pub async fn work(state: Arc<GatewayState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
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
        // Overlapping windows: a wake for a spec already sent is a no-op.
        let since = state.clock.now_ms() - 3_000;
        match state
            .metrics
            .timed(
                "nodes_with_work",
                state.store.nodes_with_work(&state.id, since),
            )
            .await
        {
            Ok(nodes) => {
                for n in nodes {
                    state.wake(&n);
                }
            }
            Err(e) => warn!(error = %e, "cannot look for pending work"),
        }
    }
}
