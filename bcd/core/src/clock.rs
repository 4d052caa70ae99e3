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
//!
//! The same unsigned time must not push the mark out of reach of honest
//! gateways (a mark ten years ahead would refuse every honest Welcome for
//! ten years). So the mark moves no further than the node's own clocks
//! allow: at most [`SLACK`] past its *ceiling*, the larger of
//!
//! - a base (a server time known to have passed, at a reading of the boot
//!   clock, `CLOCK_BOOTTIME`, of one boot) plus the boot clock's progress
//!   since: server time cannot run faster than the machine's own clock;
//! - the node's own wall clock, which no gateway sets.
//!
//! The base is persisted with the mark and kept for the whole boot, so
//! restarting the daemon does not restart the allowance. A new boot (or a
//! mark written before bases existed) starts a new base at the mark less
//! [`SLACK`], the most a gateway can have pushed it. A gateway can
//! therefore move the mark at most [`SLACK`] ahead of true server time,
//! however long it holds the node.
//!
//! Nor does the node take a gateway's word for server time beyond what a
//! key vouches for: a gateway that dates its Welcome a day ahead would
//! otherwise make every valid signed command `expired`, for good. Once the
//! node holds a gateway revocation list (the key holder signs one every
//! tenth of its life, and every gateway hands it on), server time is
//! *limited*: it is never taken past the newest list's signed issue time
//! plus a tenth of the list's life, plus [`SLACK`], plus the node's
//! monotonic time since it took that list ([`ServerClock::signed_time`]).
//! Before a list reaches this process, the limit is the mark plus
//! [`SLACK`] plus the time since the process started
//! ([`ServerClock::limit_from_mark`]), until the list a gateway hands on
//! lifts it. A time past the limit is not obeyed: the estimate stops at
//! the limit, so no deadline passes early, and the session reports it
//! ([`ServerClock::ahead_of_signed`]). Never the node's wall clock: a
//! ramdisk may have none.

use std::time::Duration;

/// How far before the mark a Welcome may be and still be accepted.
pub const MAX_REWIND: Duration = Duration::from_secs(5 * 60);

/// How far past the node's own clocks the mark may move.
pub const SLACK: Duration = Duration::from_secs(60);

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

/// A server time known to have passed at a reading of one boot's boot
/// clock: what bounds the mark (persisted with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` of that boot, milliseconds.
    pub boot_ms: i64,
    /// Server time, unix milliseconds.
    pub server_ms: i64,
}

/// The mark as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mark {
    /// Unix milliseconds; only moves forward.
    pub ms: i64,
    /// `None` in a file written before bases existed.
    pub base: Option<Base>,
}

/// The node's own clocks when the process started (its monotonic `now` is
/// counted from then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Witness {
    pub boot_id: String,
    /// `CLOCK_BOOTTIME`, milliseconds.
    pub boot_ms: i64,
    /// The wall clock, unix milliseconds; 0 or less: none.
    pub wall_ms: i64,
}

impl Witness {
    /// Clocks that allow nothing beyond a mark's own base: for a node that
    /// cannot read them (and for tests).
    pub fn none(boot_id: &str) -> Witness {
        Witness {
            boot_id: boot_id.to_string(),
            boot_ms: 0,
            wall_ms: 0,
        }
    }
}

/// `now` arguments are the node's monotonic clock since the process
/// started; server times are unix milliseconds on the store's clock.
#[derive(Debug, Clone)]
pub struct ServerClock {
    mark_ms: i64,
    base: Base,
    witness: Witness,
    anchor: Option<(Duration, i64)>,
    /// From the mark, until a signed time comes.
    mark_limit: Option<Limit>,
    /// From the furthest signed time.
    signed_limit: Option<Limit>,
    max_rewind_ms: i64,
    slack_ms: i64,
}

/// The furthest server time may be: `ms` at the node's monotonic `at`,
/// plus the time since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limit {
    at: Duration,
    ms: i64,
}

impl Limit {
    fn at(&self, now: Duration) -> i64 {
        self.ms.saturating_add(ms(now.saturating_sub(self.at)))
    }
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

impl ServerClock {
    /// Starts from the mark persisted in `identity.json` (0 on a new node)
    /// and the node's clocks now. The mark's base stays when it is of this
    /// boot; otherwise a new one starts here.
    pub fn new(mark: Mark, witness: Witness) -> Self {
        let slack_ms = ms(SLACK);
        let base = match mark.base {
            Some(b) if b.boot_id == witness.boot_id && b.boot_ms <= witness.boot_ms => b,
            _ => Base {
                boot_id: witness.boot_id.clone(),
                boot_ms: witness.boot_ms,
                server_ms: mark.ms.saturating_sub(slack_ms),
            },
        };
        ServerClock {
            mark_ms: mark.ms,
            base,
            witness,
            anchor: None,
            mark_limit: None,
            signed_limit: None,
            max_rewind_ms: ms(MAX_REWIND),
            slack_ms,
        }
    }

    pub fn mark_ms(&self) -> i64 {
        self.mark_ms
    }

    /// What to persist.
    pub fn mark(&self) -> Mark {
        Mark {
            ms: self.mark_ms,
            base: Some(self.base.clone()),
        }
    }

    /// The furthest the mark may be at `now`: the base plus the boot
    /// clock's progress, or the wall clock, whichever is later, plus the
    /// slack.
    pub fn ceiling(&self, now: Duration) -> i64 {
        let boot_now = self.witness.boot_ms.saturating_add(ms(now));
        let by_boot = self
            .base
            .server_ms
            .saturating_add(boot_now.saturating_sub(self.base.boot_ms));
        // A wall clock at or before 1970 is one the node does not have.
        let by_wall = if self.witness.wall_ms > 0 {
            self.witness.wall_ms.saturating_add(ms(now))
        } else {
            i64::MIN
        };
        by_boot.max(by_wall).saturating_add(self.slack_ms)
    }

    /// Moves the mark towards `server_ms`, as far as the ceiling allows.
    fn raise(&mut self, now: Duration, server_ms: i64) {
        let to = server_ms.min(self.ceiling(now));
        self.mark_ms = self.mark_ms.max(to);
    }

    /// The node holds a signed time source (a gateway revocation list):
    /// until one reaches this process, server time is limited to the mark
    /// plus the slack plus the time since `now`.
    pub fn limit_from_mark(&mut self, now: Duration) {
        if self.mark_limit.is_none() {
            self.mark_limit = Some(Limit {
                at: now,
                ms: self.mark_ms.saturating_add(self.slack_ms),
            });
        }
    }

    /// A key signed that server time was `issued_ms` not long before
    /// `now`: at most `ahead` before (how often such a time is signed) plus
    /// the slack. Server time is limited to that plus the time since; of
    /// several limits the furthest holds (an older list replayed lowers
    /// nothing, nor does a list signed while the key holder was away
    /// lower the mark's).
    pub fn signed_time(&mut self, now: Duration, issued_ms: i64, ahead: Duration) {
        let offered = Limit {
            at: now,
            ms: issued_ms
                .saturating_add(ms(ahead))
                .saturating_add(self.slack_ms),
        };
        match self.signed_limit {
            Some(held) if held.at(now) >= offered.ms => {}
            _ => self.signed_limit = Some(offered),
        }
    }

    /// The furthest server time may be now, if limited.
    pub fn limit_ms(&self, now: Duration) -> Option<i64> {
        let mark = self.mark_limit.map(|l| l.at(now));
        let signed = self.signed_limit.map(|l| l.at(now));
        mark.max(signed)
    }

    /// The gateway's server time now and the limit it is past, if a signed
    /// time sets one and the gateway's time is past it.
    pub fn ahead_of_signed(&self, now: Duration) -> Option<(i64, i64)> {
        self.signed_limit?;
        let said = self.said_now(now)?;
        let limit = self.limit_ms(now)?;
        (said > limit).then_some((said, limit))
    }

    /// Server time as the gateway's last time says, unlimited.
    fn said_now(&self, now: Duration) -> Option<i64> {
        let (at, server) = self.anchor?;
        Some(server.saturating_add(ms(now.saturating_sub(at))))
    }

    /// Applies a Welcome's server time. On success the clock is anchored and
    /// the mark moves towards the server time if it is later.
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
        if let Some(t) = self.server_now(now) {
            self.raise(now, t);
        }
        Ok(())
    }

    /// Re-anchors on a later server time sample (heartbeat acks) without the
    /// Welcome check; samples that would move server time backwards relative
    /// to the current estimate are ignored, so the estimate is monotonic.
    pub fn on_sample(&mut self, now: Duration, server_time_ms: i64) {
        match self.said_now(now) {
            Some(said) if server_time_ms <= said => {}
            None => {}
            Some(_) => {
                self.anchor = Some((now, server_time_ms));
                if let Some(t) = self.server_now(now) {
                    self.raise(now, t);
                }
            }
        }
    }

    /// Server time now, if a Welcome anchored the clock in this process:
    /// the gateway's time, no further than the limit.
    pub fn server_now(&self, now: Duration) -> Option<i64> {
        let said = self.said_now(now)?;
        Some(match self.limit_ms(now) {
            Some(limit) => said.min(limit),
            None => said,
        })
    }

    /// Moves the mark forward to the current estimate (as far as the
    /// ceiling allows) and returns it, for persisting. The mark never moves
    /// backward.
    pub fn advance(&mut self, now: Duration) -> i64 {
        if let Some(estimate) = self.server_now(now) {
            self.raise(now, estimate);
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
    const DAY: i64 = 24 * 60 * MIN;

    /// A node whose wall clock is right at `wall` (0: unknown), booted at
    /// boot-clock reading `boot`.
    fn clock(mark: i64, boot: i64, wall: i64) -> ServerClock {
        ServerClock::new(
            Mark {
                ms: mark,
                base: None,
            },
            Witness {
                boot_id: "b1".into(),
                boot_ms: boot,
                wall_ms: wall,
            },
        )
    }

    #[test]
    fn evaluates_server_time_through_the_offset() {
        let mut c = clock(0, 0, 0);
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
        let mut c = clock(mark, 0, 0);
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

    #[test]
    fn a_future_dated_welcome_moves_the_mark_no_further_than_the_nodes_clocks() {
        // The node knows server time 1,000 days in; its wall clock is lost.
        let truth = 1_000 * DAY;
        let mut c = clock(truth, 50_000, 0);
        // A gateway says it is ten years later.
        c.on_welcome(Duration::from_secs(1), truth + 3650 * DAY)
            .unwrap();
        // The session runs on that (deadlines follow the anchor) ...
        assert_eq!(
            c.server_now(Duration::from_secs(1)),
            Some(truth + 3650 * DAY)
        );
        // ... but the mark is at most the slack past the boot clock's
        // progress (the new base starts the slack below the old mark).
        let persisted = c.advance(Duration::from_secs(61));
        assert_eq!(persisted, truth + 61_000);
        assert!(c.mark_ms() <= truth + 61_000 + SLACK.as_millis() as i64);
        // An honest Welcome still passes, in this process and the next one
        // on the same boot (the base is kept).
        let record = c.mark();
        c.on_welcome(Duration::from_secs(62), truth + 62_000)
            .unwrap();
        let mut next = ServerClock::new(
            record.clone(),
            Witness {
                boot_id: "b1".into(),
                boot_ms: 50_000 + 70_000,
                wall_ms: 0,
            },
        );
        next.on_welcome(Duration::ZERO, truth + 70_000).unwrap();
        // The restart does not restart the allowance: the ceiling still
        // counts from the base.
        next.on_welcome(Duration::ZERO, truth + 3650 * DAY).unwrap();
        assert_eq!(next.mark_ms(), truth + 70_000);
        // A new boot: the base restarts at the mark less the slack.
        let booted = ServerClock::new(
            next.mark(),
            Witness {
                boot_id: "b2".into(),
                boot_ms: 10_000,
                wall_ms: 0,
            },
        );
        assert_eq!(
            booted.ceiling(Duration::ZERO),
            truth + 70_000,
            "the mark less the slack, plus the slack"
        );
    }

    #[test]
    fn the_wall_clock_lets_a_long_powered_off_node_catch_up() {
        let mark = 1_000 * DAY;
        // Off for 30 days; the wall clock kept time.
        let mut c = clock(mark, 5_000, mark + 30 * DAY);
        c.on_welcome(Duration::ZERO, mark + 30 * DAY).unwrap();
        assert_eq!(c.mark_ms(), mark + 30 * DAY);
        // Without a wall clock it lags, harmlessly: the mark is only a floor.
        let mut c = clock(mark, 5_000, 0);
        c.on_welcome(Duration::ZERO, mark + 30 * DAY).unwrap();
        assert_eq!(c.mark_ms(), mark);
    }

    #[test]
    fn a_time_past_the_signed_limit_is_not_obeyed() {
        let truth = 1_000 * DAY;
        let mut c = clock(truth, 0, 0);
        // The newest list was signed 30 s ago; lists are signed every
        // minute.
        c.signed_time(Duration::ZERO, truth - 30_000, Duration::from_secs(60));
        // A gateway dates its Welcome a day ahead.
        c.on_welcome(Duration::ZERO, truth + DAY).unwrap();
        let limit = truth - 30_000 + 60_000 + SLACK.as_millis() as i64;
        assert_eq!(c.server_now(Duration::ZERO), Some(limit));
        assert_eq!(
            c.ahead_of_signed(Duration::ZERO),
            Some((truth + DAY, limit))
        );
        // A command that runs out in an hour is not past, now or in ten
        // minutes; time runs on from the limit.
        assert!(!c.is_past(Duration::ZERO, truth + 60 * MIN));
        assert_eq!(
            c.server_now(Duration::from_secs(600)),
            Some(limit + 600_000)
        );
        assert!(!c.is_past(Duration::from_secs(600), truth + 60 * MIN));
        // Heartbeats that say the same are held to it too.
        c.on_sample(Duration::from_secs(601), truth + DAY + 601_000);
        assert_eq!(
            c.server_now(Duration::from_secs(601)),
            Some(limit + 601_000)
        );
        // The mark moves no further than the limit either.
        c.advance(Duration::from_secs(601));
        assert!(c.mark_ms() <= limit + 601_000);
    }

    #[test]
    fn an_honest_time_is_taken_as_said() {
        let truth = 1_000 * DAY;
        let mut c = clock(truth, 0, 0);
        c.signed_time(Duration::ZERO, truth - 59_000, Duration::from_secs(60));
        c.on_welcome(Duration::ZERO, truth + 1_000).unwrap();
        assert_eq!(c.server_now(Duration::ZERO), Some(truth + 1_000));
        assert_eq!(c.ahead_of_signed(Duration::ZERO), None);
        // A list replayed from long ago lowers nothing.
        c.signed_time(Duration::from_secs(5), truth - DAY, Duration::from_secs(60));
        assert_eq!(c.server_now(Duration::from_secs(5)), Some(truth + 6_000));
    }

    #[test]
    fn the_mark_limits_until_a_signed_time_lifts_it() {
        let mark = 1_000 * DAY;
        let mut c = clock(mark, 0, 0);
        c.limit_from_mark(Duration::ZERO);
        // The node was off a day; the honest Welcome says so.
        c.on_welcome(Duration::ZERO, mark + DAY).unwrap();
        let slack = SLACK.as_millis() as i64;
        assert_eq!(c.server_now(Duration::ZERO), Some(mark + slack));
        // Not a signed limit: nothing to report.
        assert_eq!(c.ahead_of_signed(Duration::ZERO), None);
        // The list the gateway hands on next lifts it to the gateway's
        // time at once.
        c.signed_time(
            Duration::from_millis(10),
            mark + DAY - 20_000,
            Duration::from_secs(60),
        );
        assert_eq!(
            c.server_now(Duration::from_millis(10)),
            Some(mark + DAY + 10)
        );
        // A list signed while the key holder was away a week lowers
        // nothing the mark allows.
        let mut c = clock(mark, 0, 0);
        c.limit_from_mark(Duration::ZERO);
        c.signed_time(Duration::ZERO, mark - 7 * DAY, Duration::from_secs(60));
        c.on_welcome(Duration::ZERO, mark + 10_000).unwrap();
        assert_eq!(c.server_now(Duration::ZERO), Some(mark + 10_000));
    }

    proptest! {
        #[test]
        fn mark_never_moves_backward(
            start in 0i64..1_000_000_000,
            steps in proptest::collection::vec((0u64..100_000, -20 * MIN..20 * MIN, 0u8..3), 1..60),
        ) {
            let mut c = clock(start, 0, start);
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

        /// Whatever a gateway sends, over any number of restarts and
        /// reboots, the mark stays within the slack of true server time
        /// (which runs with the boot clock while the machine is up), so an
        /// honest Welcome is never refused.
        #[test]
        fn no_gateway_pushes_the_mark_out_of_reach(
            truth0 in 1_000_000i64..1_000_000_000,
            steps in proptest::collection::vec(
                (0u64..600_000, any::<i64>(), 0u8..4, 0i64..DAY), 1..80),
        ) {
            let mut truth = truth0;
            let mut boot = 1u32;
            let mut boot_clock = 10_000i64;
            let mut c = clock(truth, boot_clock, 0);
            let mut now = Duration::ZERO;
            for (dt, forged, op, downtime) in steps {
                now += Duration::from_millis(dt);
                truth += dt as i64;
                boot_clock += dt as i64;
                match op {
                    0 => { let _ = c.on_welcome(now, forged); }
                    1 => c.on_sample(now, forged),
                    2 => {
                        // A restart on the same boot.
                        c = ServerClock::new(c.mark(), Witness {
                            boot_id: format!("b{boot}"), boot_ms: boot_clock, wall_ms: 0,
                        });
                        now = Duration::ZERO;
                    }
                    _ => {
                        // A reboot after some downtime.
                        boot += 1;
                        truth += downtime;
                        boot_clock = 1_000;
                        c = ServerClock::new(c.mark(), Witness {
                            boot_id: format!("b{boot}"), boot_ms: boot_clock, wall_ms: 0,
                        });
                        now = Duration::ZERO;
                    }
                }
                c.advance(now);
                prop_assert!(c.mark_ms() <= truth + SLACK.as_millis() as i64,
                    "mark {} ahead of truth {}", c.mark_ms(), truth);
                let mut probe = c.clone();
                prop_assert!(probe.on_welcome(now, truth).is_ok());
            }
        }

        /// Whatever a gateway says, server time is never taken further
        /// than the signed limit; and with the key holder signing a list
        /// every minute, an honest gateway's time is taken as said.
        #[test]
        fn no_gateway_dates_the_node_past_the_signed_limit(
            truth0 in 1_000_000i64..1_000_000_000,
            steps in proptest::collection::vec(
                (0u64..120_000, any::<i64>(), 0u8..4, 0i64..60_000), 1..80),
        ) {
            const EVERY: Duration = Duration::from_secs(60);
            let slack = SLACK.as_millis() as i64;
            let mut truth = truth0;
            let mut c = clock(truth, 0, 0);
            c.limit_from_mark(Duration::ZERO);
            let mut now = Duration::ZERO;
            let mut honest = false;
            for (dt, forged, op, age) in steps {
                now += Duration::from_millis(dt);
                truth += dt as i64;
                match op {
                    0 => { honest = false; let _ = c.on_welcome(now, forged); }
                    1 => { honest = false; c.on_sample(now, forged); }
                    2 => {
                        // A list signed less than a minute ago.
                        c.signed_time(now, truth - age, EVERY);
                    }
                    _ => {
                        honest = c.on_welcome(now, truth).is_ok();
                    }
                }
                if let Some(t) = c.server_now(now) {
                    prop_assert!(t <= truth + ms(EVERY) + slack,
                        "server time {} past truth {}", t, truth);
                    if honest && op == 3 {
                        prop_assert_eq!(t, truth);
                    }
                }
            }
        }

        #[test]
        fn estimate_is_monotonic_between_welcomes(
            welcome in 0i64..1_000_000_000,
            samples in proptest::collection::vec((0u64..10_000, -MIN..MIN), 1..40),
        ) {
            let mut c = clock(0, 0, 0);
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
