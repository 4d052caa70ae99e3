//! The gateway's lease, `gateway:<id>`: renewed every quarter TTL on a
//! connection of its own (so renewals never wait behind Hellos). Without a
//! renewal for half the TTL, or on finding another owner, the gateway
//! fences itself: it closes every stream UNAVAILABLE and refuses new ones
//! until it holds the lease again. A renewal waits only until that
//! deadline ([`renewal_budget`]), so a database that hangs rather than
//! refuses fences the gateway at half the TTL too (10 s at the default
//! 20 s), not half a TTL after the renewal that hung began. A renewal
//! that holds the lease again after it ran out (the process was paused,
//! its host frozen: the store's clock moved a TTL since the last one)
//! fences first, so a zombie that wakes closes its sessions instead of
//! carrying on with them. Each renewal anchors the gateway's
//! clock to the store's, and measures how far this process's own clock is
//! from it: past [`CLOCK_SKEW_LIMIT`] the gateway raises ClockSkew (a
//! warning with the `clock_offset_seconds` figure). Its own clock decides
//! nothing (liveness goes to the store as ages), so a skewed gateway keeps
//! serving; the warning is for whoever runs its time sync.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::GatewayState;

/// How far a control-plane process's clock may be from the store's before
/// it raises ClockSkew.
pub const CLOCK_SKEW_LIMIT: Duration = Duration::from_secs(1);
/// How often a skew that persists is raised again.
const SKEW_REPEAT: Duration = Duration::from_secs(60);

/// How far this process's clock is ahead of the store's (negative:
/// behind), from a renewal that began at `own_before` and answered at
/// `own_after` on this process's clock with the store's `store_now`: the
/// store read its clock somewhere in between, taken as the middle.
pub fn clock_offset_ms(own_before: i64, own_after: i64, store_now: i64) -> i64 {
    own_before + (own_after - own_before) / 2 - store_now
}

/// Whether an offset is ClockSkew.
pub fn skewed(offset_ms: i64) -> bool {
    offset_ms.unsigned_abs() > CLOCK_SKEW_LIMIT.as_millis() as u64
}

/// What a renewal attempt came back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Held; the store's now and the lease's generation (the same only
    /// while this owner renewed it in time).
    Held(i64, u64),
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
    /// Held again, but after a gap in which the lease ran out (a paused
    /// process, a frozen host): its sessions may have moved to other
    /// gateways, so fence (close every session) first, then hold.
    Rehold(i64, &'static str),
    Fence(&'static str),
    /// Not fenced yet: retry at the next tick.
    Wait,
}

/// Decides from a renewal, the time since the last good one on this
/// process's monotonic clock (`None`: never renewed) and the store's time
/// and the lease's generation at it (`None`: never renewed).
pub fn decide(
    r: Renewal,
    since_last_ok: Option<Duration>,
    last: Option<(i64, u64)>,
    ttl: Duration,
) -> Action {
    match r {
        // The store says the lease was taken again since (it ran out in
        // between, however the clocks look from here).
        Renewal::Held(now, generation) if last.is_some_and(|(_, g)| g != generation) => {
            Action::Rehold(now, "the gateway lease was taken again after it lapsed")
        }
        // The store's own clock says a whole TTL passed since the last
        // renewal, so the lease ran out in between whatever this process
        // saw of it (a paused virtual machine's clock stands still); or
        // this process went half a TTL without renewing and without
        // fencing (it did not run).
        Renewal::Held(now, _)
            if last.is_some_and(|(was, _)| now.saturating_sub(was) >= ms(ttl))
                || since_last_ok.is_some_and(|d| d >= ttl / 2) =>
        {
            Action::Rehold(now, "the gateway lease lapsed before this renewal")
        }
        Renewal::Held(now, _) => Action::Hold(now),
        Renewal::Taken => Action::Fence("another owner holds the gateway lease"),
        Renewal::Failed if since_last_ok.is_none_or(|d| d >= ttl / 2) => {
            Action::Fence("no lease renewal for half the lease TTL")
        }
        Renewal::Failed => Action::Wait,
    }
}

/// How long a renewal may take: until half the TTL after the last good
/// one (when the gateway fences without one); a whole half TTL when there
/// was none, or the deadline has passed (fenced already, waiting to hold
/// it again).
pub fn renewal_budget(since_last_ok: Option<Duration>, ttl: Duration) -> Duration {
    let half = ttl / 2;
    match since_last_ok {
        Some(d) if d < half => half - d,
        _ => half,
    }
}

/// How long until the gateway fences unless a renewal holds first: after a
/// renewal that failed (`failing`), half the TTL from the last good one.
/// `None` when nothing is due: the last renewal held, or the gateway is
/// fenced already. A renewal refused at once a hair before the deadline
/// therefore fences at the deadline, not a tick later.
pub fn fence_in(
    failing: bool,
    fenced: bool,
    since_last_ok: Option<Duration>,
    ttl: Duration,
) -> Option<Duration> {
    match since_last_ok {
        Some(d) if failing && !fenced => Some((ttl / 2).saturating_sub(d)),
        _ => None,
    }
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// Keeps the lease for as long as the gateway runs.
pub async fn keep(state: Arc<GatewayState>) {
    let ttl = state.timing.gateway_lease_ttl;
    let mut last_ok: Option<Instant> = None;
    // The store's now and the lease's generation at the last hold.
    let mut last: Option<(i64, u64)> = None;
    let mut tick = tokio::time::interval(ttl / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let name = state.lease_name();
    let mut skew_raised: Option<Instant> = None;
    // The last renewal failed and the gateway still serves.
    let mut failing = false;
    loop {
        let due = fence_in(
            failing,
            state.is_fenced(),
            last_ok.map(|t| t.elapsed()),
            ttl,
        );
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() => {
                state.fence("no lease renewal for half the lease TTL");
                continue;
            }
        }
        // A stopping gateway releases its lease with its sessions; a
        // renewal after that would hold it again for a whole TTL.
        let _renewing = state.renewing.lock().await;
        if state.stopping.load(Ordering::SeqCst) {
            return;
        }
        let own_before = crate::clock::unix_ms();
        // Timed with its bound, so a renewal that times out is counted.
        let renewal = match state
            .metrics
            .timed(
                "renew_lease",
                tokio::time::timeout(
                    renewal_budget(last_ok.map(|t| t.elapsed()), ttl),
                    state.store.hold_lease(&name, &state.id, ttl),
                ),
            )
            .await
        {
            Ok(Ok(Some(held))) => Renewal::Held(held.now_ms, held.generation),
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
        let action = decide(renewal, last_ok.map(|t| t.elapsed()), last, ttl);
        failing = action == Action::Wait;
        let held = match action {
            Action::Hold(now) => Some(now),
            Action::Rehold(now, why) => {
                state.fence(why);
                Some(now)
            }
            Action::Fence(why) => {
                state.fence(why);
                None
            }
            Action::Wait => None,
        };
        if let (Some(now), Renewal::Held(_, generation)) = (held, renewal) {
            last = Some((now, generation));
            state.clock.anchor(now);
            last_ok = Some(Instant::now());
            let offset = clock_offset_ms(own_before, crate::clock::unix_ms(), now);
            state.clock_offset_ms.store(offset, Ordering::Relaxed);
            let seconds = offset as f64 / 1000.0;
            state.metrics.clock_offset_seconds.set(seconds);
            if skewed(offset) {
                if skew_raised.is_none_or(|t| t.elapsed() >= SKEW_REPEAT) {
                    skew_raised = Some(Instant::now());
                    warn!(
                        gateway = %state.id,
                        clock_offset_seconds = seconds,
                        "ClockSkew: this host's clock is {seconds:+.1}s off the store's; \
                         nothing here trusts it, but fix the host's time sync"
                    );
                }
            } else if skew_raised.take().is_some() {
                info!(gateway = %state.id, clock_offset_seconds = seconds, "clock back within the skew limit");
            }
            // Before the first session is admitted: the window its
            // Welcome carries is sized from the fleet, not the starting
            // figure. A store too slow to say delays admission no more
            // than a quarter of the lease; the work loop sizes it later.
            if state.is_fenced() && !state.stopping.load(Ordering::SeqCst) {
                let _ = tokio::time::timeout(ttl / 4, super::feeds::size_first_retry(&state)).await;
            }
            if !state.stopping.load(Ordering::SeqCst) && state.fenced.swap(false, Ordering::SeqCst)
            {
                info!(gateway = %state.id, "holding the gateway lease; admitting sessions");
            }
            if !state.stopping.load(Ordering::SeqCst) {
                state.metrics.fenced.set(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(20);

    #[test]
    fn a_renewal_waits_no_longer_than_the_fence_deadline() {
        let s = Duration::from_secs;
        assert_eq!(renewal_budget(Some(s(0)), TTL), s(10));
        // The tick after a good renewal: five seconds left, not ten.
        assert_eq!(renewal_budget(Some(s(5)), TTL), s(5));
        // A hair before the deadline: only what is left of it.
        assert_eq!(
            renewal_budget(Some(Duration::from_millis(9_900)), TTL),
            Duration::from_millis(100)
        );
        // Fenced already, or never held: a whole half TTL to get it back.
        assert_eq!(renewal_budget(Some(s(12)), TTL), s(10));
        assert_eq!(renewal_budget(None, TTL), s(10));
        // A renewal that hangs from the tick after a good one therefore
        // ends by the deadline, where decide() fences.
        let since = s(5) + renewal_budget(Some(s(5)), TTL);
        assert!(matches!(
            decide(Renewal::Failed, Some(since), None, TTL),
            Action::Fence(_)
        ));
    }

    #[test]
    fn a_failed_renewal_fences_at_the_deadline_not_a_tick_later() {
        let s = Duration::from_secs;
        // Refused at the tick 5 s after the last good renewal: fenced 5 s
        // on, at the deadline, though the next tick is 5 s away too; and
        // refused a hair before it, fenced at it, not at the tick after.
        assert_eq!(fence_in(true, false, Some(s(5)), TTL), Some(s(5)));
        assert_eq!(
            fence_in(true, false, Some(Duration::from_millis(9_990)), TTL),
            Some(Duration::from_millis(10))
        );
        assert_eq!(
            fence_in(true, false, Some(s(12)), TTL),
            Some(Duration::ZERO)
        );
        // Holding, fenced already, or never held: nothing due.
        assert_eq!(fence_in(false, false, Some(s(5)), TTL), None);
        assert_eq!(fence_in(true, true, Some(s(5)), TTL), None);
        assert_eq!(fence_in(true, false, None, TTL), None);
    }

    #[test]
    fn a_lease_held_again_after_it_lapsed_fences_first() {
        let s = Duration::from_secs;
        // The store's clock moved a whole TTL since the last renewal: the
        // lease ran out in between, whatever this process's clock says.
        assert!(matches!(
            decide(
                Renewal::Held(121_000, 1),
                Some(s(5)),
                Some((100_000, 1)),
                TTL
            ),
            Action::Rehold(121_000, _)
        ));
        // This process did not run for half a TTL.
        assert!(matches!(
            decide(
                Renewal::Held(105_000, 1),
                Some(s(11)),
                Some((100_000, 1)),
                TTL
            ),
            Action::Rehold(105_000, _)
        ));
        // The store took it again since: a new generation, whatever the
        // clocks (a renewal that looks on time here).
        assert!(matches!(
            decide(
                Renewal::Held(105_000, 2),
                Some(s(5)),
                Some((100_000, 1)),
                TTL
            ),
            Action::Rehold(105_000, "the gateway lease was taken again after it lapsed")
        ));
        // A renewal on time holds.
        assert_eq!(
            decide(
                Renewal::Held(105_000, 1),
                Some(s(5)),
                Some((100_000, 1)),
                TTL
            ),
            Action::Hold(105_000)
        );
    }

    #[test]
    fn a_held_lease_anchors_the_clock() {
        assert_eq!(
            decide(Renewal::Held(5, 1), None, None, TTL),
            Action::Hold(5)
        );
    }

    #[test]
    fn another_owner_fences_at_once() {
        assert!(matches!(
            decide(Renewal::Taken, Some(Duration::ZERO), None, TTL),
            Action::Fence(_)
        ));
    }

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_renewal() {
        assert_eq!(clock_offset_ms(1_000, 1_010, 1_005), 0);
        assert_eq!(clock_offset_ms(4_000, 4_010, 1_005), 3_000);
        assert_eq!(clock_offset_ms(1_000, 1_000, 2_500), -1_500);
        assert!(!skewed(1_000) && !skewed(-1_000));
        assert!(skewed(1_001) && skewed(-1_001));
    }

    #[test]
    fn failures_fence_after_half_the_ttl_without_a_renewal() {
        assert_eq!(
            decide(
                Renewal::Failed,
                Some(Duration::from_millis(9_999)),
                None,
                TTL
            ),
            Action::Wait
        );
        assert!(matches!(
            decide(Renewal::Failed, Some(Duration::from_secs(10)), None, TTL),
            Action::Fence("no lease renewal for half the lease TTL")
        ));
        assert!(
            matches!(decide(Renewal::Failed, None, None, TTL), Action::Fence(_)),
            "never held: fenced"
        );
    }
}
