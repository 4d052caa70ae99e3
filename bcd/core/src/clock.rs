//! Server time on the node.
//!
//! bcd never trusts its own wall clock for decisions the fleet shares. Every
//! Welcome carries the store's `compute_now()`; the node anchors it to its
//! monotonic clock and evaluates server time as `server_time + (now - then)`,
//! so a node whose wall clock is minutes off still agrees with the fleet.
//!
//! Because `server_time` is not signed, the node also keeps a *server time
//! mark* that only moves forward and is persisted in `identity.json`. A
//! Welcome more than [`MAX_REWIND`] before the mark is refused: a gateway
//! cannot rewind the node into an expired window.

use std::time::Duration;

/// How far before the mark a Welcome may be and still be accepted.
pub const MAX_REWIND: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "the gateway's server time {server_time_ms} is {behind_ms} ms before this node's server \
         time mark {mark_ms} (more than 5 minutes): refusing the Welcome"
    )]
    WelcomeBeforeMark {
        server_time_ms: i64,
        mark_ms: i64,
        behind_ms: i64,
    },
}

/// `now` arguments are the node's monotonic clock; server times are unix
/// milliseconds on the store's clock.
#[derive(Debug, Clone)]
pub struct ServerClock {
    mark_ms: i64,
    anchor: Option<(Duration, i64)>,
    max_rewind_ms: i64,
}

impl ServerClock {
    /// Starts from the mark persisted in `identity.json` (0 on a new node).
    pub fn new(mark_ms: i64) -> Self {
        ServerClock {
            mark_ms,
            anchor: None,
            max_rewind_ms: MAX_REWIND.as_millis() as i64,
        }
    }

    pub fn mark_ms(&self) -> i64 {
        self.mark_ms
    }

    /// Applies a Welcome's server time. On success the clock is anchored and
    /// the mark moves forward to the server time if it is later.
    pub fn on_welcome(&mut self, now: Duration, server_time_ms: i64) -> Result<(), ClockError> {
        let behind = self.mark_ms.saturating_sub(server_time_ms);
        if behind > self.max_rewind_ms {
            return Err(ClockError::WelcomeBeforeMark {
                server_time_ms,
                mark_ms: self.mark_ms,
                behind_ms: behind,
            });
        }
        self.anchor = Some((now, server_time_ms));
        self.mark_ms = self.mark_ms.max(server_time_ms);
        Ok(())
    }

    /// Re-anchors on a later server time sample (heartbeat acks) without the
    /// Welcome check; samples that would move server time backwards relative
    /// to the current estimate are ignored, so the estimate is monotonic.
    pub fn on_sample(&mut self, now: Duration, server_time_ms: i64) {
        match self.server_now(now) {
            Some(estimate) if server_time_ms <= estimate => {}
            _ if self.anchor.is_none() => {}
            _ => {
                self.anchor = Some((now, server_time_ms));
                self.mark_ms = self.mark_ms.max(server_time_ms);
            }
        }
    }

    /// Server time now, if a Welcome anchored the clock in this process.
    pub fn server_now(&self, now: Duration) -> Option<i64> {
        let (at, server) = self.anchor?;
        let elapsed = now.saturating_sub(at).as_millis() as i64;
        Some(server.saturating_add(elapsed))
    }

    /// Moves the mark forward to the current estimate and returns it, for
    /// persisting. The mark never moves backward.
    pub fn advance(&mut self, now: Duration) -> i64 {
        if let Some(estimate) = self.server_now(now) {
            self.mark_ms = self.mark_ms.max(estimate);
        }
        self.mark_ms
    }

    /// Whether a deadline in server time has passed. Without an anchor the
    /// mark stands in for now: a deadline before the mark has certainly
    /// passed.
    pub fn is_past(&self, now: Duration, deadline_ms: i64) -> bool {
        self.now_or_mark(now) > deadline_ms
    }

    /// Server time now, or the mark before a Welcome anchored the clock
    /// (the latest server time this node knows to have passed).
    pub fn now_or_mark(&self, now: Duration) -> i64 {
        self.server_now(now).unwrap_or(self.mark_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: i64 = 60_000;

    #[test]
    fn evaluates_server_time_through_the_offset() {
        let mut c = ServerClock::new(0);
        assert_eq!(c.server_now(Duration::from_secs(5)), None);
        assert_eq!(c.now_or_mark(Duration::from_secs(5)), 0);
        c.on_welcome(Duration::from_secs(100), 1_000_000).unwrap();
        assert_eq!(c.server_now(Duration::from_secs(103)), Some(1_003_000));
        assert_eq!(c.now_or_mark(Duration::from_secs(103)), 1_003_000);
        assert!(c.is_past(Duration::from_secs(103), 1_002_999));
        assert!(!c.is_past(Duration::from_secs(103), 1_003_000));
    }

    #[test]
    fn refuses_a_welcome_more_than_five_minutes_before_the_mark() {
        let mark = 10_000 * MIN;
        let mut c = ServerClock::new(mark);
        let err = c
            .on_welcome(Duration::ZERO, mark - 5 * MIN - 1)
            .unwrap_err();
        assert!(matches!(err, ClockError::WelcomeBeforeMark { .. }));
        assert_eq!(
            c.server_now(Duration::ZERO),
            None,
            "a refused Welcome anchors nothing"
        );
        // Exactly five minutes back is still within tolerance.
        c.on_welcome(Duration::ZERO, mark - 5 * MIN).unwrap();
        assert_eq!(c.mark_ms(), mark, "the mark does not move back");
    }

    proptest! {
        #[test]
        fn mark_never_moves_backward(
            start in 0i64..1_000_000_000,
            steps in proptest::collection::vec((0u64..100_000, -20 * MIN..20 * MIN, 0u8..3), 1..60),
        ) {
            let mut c = ServerClock::new(start);
            let mut now = Duration::ZERO;
            let mut server = start;
            let mut last_mark = c.mark_ms();
            for (dt, jump, op) in steps {
                now += Duration::from_millis(dt);
                server = server.saturating_add(dt as i64).saturating_add(jump);
                match op {
                    0 => {
                        let before = c.mark_ms();
                        let r = c.on_welcome(now, server);
                        prop_assert_eq!(r.is_err(), before - server > 5 * MIN);
                    }
                    1 => c.on_sample(now, server),
                    _ => { c.advance(now); }
                }
                prop_assert!(c.mark_ms() >= last_mark);
                last_mark = c.mark_ms();
            }
        }

        #[test]
        fn estimate_is_monotonic_between_welcomes(
            welcome in 0i64..1_000_000_000,
            samples in proptest::collection::vec((0u64..10_000, -MIN..MIN), 1..40),
        ) {
            let mut c = ServerClock::new(0);
            let mut now = Duration::from_secs(1);
            c.on_welcome(now, welcome).unwrap();
            let mut last = c.server_now(now).unwrap();
            for (dt, skew) in samples {
                now += Duration::from_millis(dt);
                let truth = c.server_now(now).unwrap();
                c.on_sample(now, truth + skew);
                let est = c.server_now(now).unwrap();
                prop_assert!(est >= last);
                last = est;
            }
        }
    }
}
