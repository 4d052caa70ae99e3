//! The node's side of one gateway session, as a state machine.
//!
//! `Session::handle(now, event)` returns the actions the shell must perform;
//! `Session::deadline()` says when the shell must call back with
//! [`Event::Tick`] at the latest. The life of a session:
//!
//! ```text
//! Idle --(dial time)--> Dialing --Connected--> AwaitingWelcome --Welcome--> Established
//!   ^                      |                         |                          |
//!   +-------- back-off ----+---- DialFailed / Closed / timeout / refused -------+
//! ```
//!
//! Once established the node sends a Heartbeat every interval the Welcome
//! names and treats the server as gone after `missed_heartbeats` intervals
//! without hearing from it. A Welcome is refused if its epoch is not above
//! every epoch accepted before or its server time is more than five minutes
//! before the mark. A permanent refusal (node deleted, certificate revoked)
//! stops the session for good.

use std::time::Duration;

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::{ClockError, ServerClock};
use crate::epoch::{EpochError, EpochTracker};
use crate::rng::SplitMix64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    pub backoff: BackoffConfig,
    /// From an open stream to a Welcome, at most.
    pub welcome_timeout: Duration,
    /// Server silence tolerated, counted in heartbeat intervals.
    pub missed_heartbeats: u32,
    /// How often the server time mark is handed to the shell to persist.
    pub persist_mark_every: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            backoff: BackoffConfig::default(),
            welcome_timeout: Duration::from_secs(30),
            missed_heartbeats: 3,
            persist_mark_every: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Advance time; sent at `deadline()` or earlier.
    Tick,
    /// The transport is up and the stream open: the Hello can go out.
    Connected,
    /// Dialing, the TLS handshake or opening the stream failed.
    DialFailed {
        error: String,
    },
    Welcome {
        epoch: u64,
        server_time_ms: i64,
        heartbeat_interval: Duration,
        /// The server's window for the first redial after this session
        /// (zero: the configured back-off).
        first_retry: Duration,
    },
    HeartbeatAck {
        server_time_ms: i64,
    },
    /// Any other message from the server: evidence that it is alive.
    Received,
    /// The server asks the node to reconnect elsewhere within `within`.
    Drain {
        within: Duration,
    },
    /// The stream ended or broke.
    Closed {
        error: String,
    },
    /// The server refused this node for good (deleted, revoked): retrying
    /// with this identity cannot help.
    Refused {
        message: String,
    },
}

/// How the gateway ended a stream with an error, in the terms the session
/// rules need (the shell maps its transport's status codes onto these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStatus {
    Unauthenticated,
    PermissionDenied,
    /// Any other code: the stream broke or the server is unavailable.
    Other,
}

/// What the gateway says when it closes a session whose certificate ran
/// out: the node reconnects with its renewed certificate.
pub const CERT_EXPIRED: &str = "certificate expired";

impl Event {
    /// The event for a stream the gateway ended with an error: an expired
    /// certificate is a reconnect; any other authentication or permission
    /// refusal means the server refused this node for good (deleted,
    /// revoked); anything else is a broken stream, redialed with back-off.
    pub fn stream_error(status: StreamStatus, code: &str, message: &str) -> Event {
        match status {
            StreamStatus::Unauthenticated if message.starts_with(CERT_EXPIRED) => Event::Closed {
                error: message.to_string(),
            },
            StreamStatus::Unauthenticated | StreamStatus::PermissionDenied => Event::Refused {
                message: message.to_string(),
            },
            StreamStatus::Other => Event::Closed {
                error: format!("{code}: {message}"),
            },
        }
    }

    /// The gateway says this node's certificate was revoked.
    pub fn revoked(reason: &str) -> Event {
        Event::Refused {
            message: format!(
                "the node certificate was revoked ({reason}): join again: bcd join --reset --yes, \
                 then bcd join"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    WelcomeTimeout,
    ServerSilent { silent_for: Duration },
    StaleEpoch(EpochError),
    ClockRefused(ClockError),
    Drain,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::WelcomeTimeout => write!(f, "no Welcome within the timeout"),
            CloseReason::ServerSilent { silent_for } => {
                write!(f, "nothing heard from the gateway for {silent_for:?}")
            }
            CloseReason::StaleEpoch(e) => e.fmt(f),
            CloseReason::ClockRefused(e) => e.fmt(f),
            CloseReason::Drain => write!(f, "the gateway is draining"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open a transport and stream to the gateway, then report `Connected`
    /// or `DialFailed`.
    Dial,
    SendHello {
        last_epoch: u64,
        mark_ms: i64,
    },
    SendHeartbeat {
        seq: u64,
    },
    /// Tear the current stream down.
    Close {
        reason: CloseReason,
    },
    /// The session is up under this epoch.
    Established {
        epoch: u64,
        server_time_ms: i64,
    },
    /// The session ended; the next dial is after `retry_in`.
    Disconnected {
        retry_in: Duration,
    },
    /// Write the mark (and the highest epoch) to `identity.json`.
    PersistMark {
        mark_ms: i64,
        epoch: u64,
    },
    /// Give up: the daemon must exit with this message.
    Stop {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Idle {
        dial_at: Duration,
    },
    Dialing,
    AwaitingWelcome {
        since: Duration,
    },
    Established {
        epoch: u64,
        interval: Duration,
        next_heartbeat: Duration,
        last_heard: Duration,
        next_persist: Duration,
    },
    Stopped,
}

#[derive(Debug, Clone)]
pub struct Session {
    config: SessionConfig,
    state: State,
    backoff: Backoff,
    rng: SplitMix64,
    clock: ServerClock,
    epochs: EpochTracker,
    heartbeat_seq: u64,
}

impl Session {
    /// `mark_ms` and `last_epoch` come from `identity.json`. The first dial is
    /// due immediately.
    pub fn new(config: SessionConfig, seed: u64, mark_ms: i64, last_epoch: u64) -> Self {
        Session {
            config,
            state: State::Idle {
                dial_at: Duration::ZERO,
            },
            backoff: Backoff::new(config.backoff),
            rng: SplitMix64::new(seed),
            clock: ServerClock::new(mark_ms),
            epochs: EpochTracker::new(last_epoch),
            heartbeat_seq: 0,
        }
    }

    pub fn clock(&self) -> &ServerClock {
        &self.clock
    }

    pub fn epoch(&self) -> Option<u64> {
        match self.state {
            State::Established { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established { .. })
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self.state, State::Stopped)
    }

    /// The latest time at which the shell must deliver a `Tick`. `None` while
    /// waiting on the shell (dialing) or stopped.
    pub fn deadline(&self) -> Option<Duration> {
        match self.state {
            State::Idle { dial_at } => Some(dial_at),
            State::Dialing | State::Stopped => None,
            State::AwaitingWelcome { since } => Some(since + self.config.welcome_timeout),
            State::Established {
                interval,
                next_heartbeat,
                last_heard,
                next_persist,
                ..
            } => Some(
                next_heartbeat
                    .min(last_heard + interval * self.config.missed_heartbeats)
                    .min(next_persist),
            ),
        }
    }

    pub fn handle(&mut self, now: Duration, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if let Event::Refused { message } = event {
            if !matches!(self.state, State::Idle { .. } | State::Stopped) {
                out.push(Action::Disconnected {
                    retry_in: Duration::MAX,
                });
            }
            self.state = State::Stopped;
            out.push(Action::Stop { message });
            return out;
        }
        match (&mut self.state, event) {
            (State::Stopped, _) => {}
            (State::Idle { dial_at }, Event::Tick) => {
                if now >= *dial_at {
                    self.state = State::Dialing;
                    out.push(Action::Dial);
                }
            }
            (State::Idle { .. }, _) => {}
            (State::Dialing, Event::Connected) => {
                self.state = State::AwaitingWelcome { since: now };
                out.push(Action::SendHello {
                    last_epoch: self.epochs.highest(),
                    mark_ms: self.clock.mark_ms(),
                });
            }
            (State::Dialing, Event::DialFailed { .. } | Event::Closed { .. }) => {
                self.retry_later(now, &mut out);
            }
            (State::Dialing, _) => {}
            (
                State::AwaitingWelcome { .. },
                Event::Welcome {
                    epoch,
                    server_time_ms,
                    heartbeat_interval,
                    first_retry,
                },
            ) => {
                // Check the clock before the epoch so a refused Welcome
                // leaves the epoch tracker untouched, and vice versa.
                let mut probe = self.clock.clone();
                if let Err(e) = probe.on_welcome(now, server_time_ms) {
                    self.close(now, CloseReason::ClockRefused(e), &mut out);
                    return out;
                }
                if let Err(e) = self.epochs.accept(epoch) {
                    self.close(now, CloseReason::StaleEpoch(e), &mut out);
                    return out;
                }
                self.clock = probe;
                self.backoff.reset();
                self.backoff.set_base(Some(first_retry));
                let interval = heartbeat_interval.max(Duration::from_millis(10));
                self.state = State::Established {
                    epoch,
                    interval,
                    next_heartbeat: now + interval,
                    last_heard: now,
                    next_persist: now + self.config.persist_mark_every,
                };
                out.push(Action::Established {
                    epoch,
                    server_time_ms,
                });
                out.push(Action::PersistMark {
                    mark_ms: self.clock.mark_ms(),
                    epoch,
                });
            }
            (State::AwaitingWelcome { since }, Event::Tick) => {
                if now >= *since + self.config.welcome_timeout {
                    self.close(now, CloseReason::WelcomeTimeout, &mut out);
                }
            }
            (
                State::AwaitingWelcome { .. } | State::Established { .. },
                Event::Closed { .. } | Event::DialFailed { .. },
            ) => {
                self.retry_later(now, &mut out);
            }
            (
                State::AwaitingWelcome { .. } | State::Established { .. },
                Event::Drain { within },
            ) => {
                let delay = Duration::from_millis(
                    self.rng
                        .below_inclusive(within.as_millis().min(u64::MAX as u128) as u64),
                );
                out.push(Action::Close {
                    reason: CloseReason::Drain,
                });
                out.push(Action::Disconnected { retry_in: delay });
                self.state = State::Idle {
                    dial_at: now + delay,
                };
            }
            (State::AwaitingWelcome { .. }, _) => {}
            (
                State::Established {
                    epoch,
                    interval,
                    next_heartbeat,
                    last_heard,
                    next_persist,
                },
                event,
            ) => {
                match event {
                    Event::HeartbeatAck { server_time_ms } => {
                        *last_heard = now;
                        self.clock.on_sample(now, server_time_ms);
                    }
                    Event::Received | Event::Welcome { .. } => *last_heard = now,
                    _ => {}
                }
                let silent_for = now.saturating_sub(*last_heard);
                if silent_for >= *interval * self.config.missed_heartbeats {
                    self.close(now, CloseReason::ServerSilent { silent_for }, &mut out);
                    return out;
                }
                if now >= *next_heartbeat {
                    self.heartbeat_seq += 1;
                    out.push(Action::SendHeartbeat {
                        seq: self.heartbeat_seq,
                    });
                    // Keep the cadence; after a long stall, restart it from
                    // now rather than sending a burst.
                    *next_heartbeat += *interval;
                    if *next_heartbeat <= now {
                        *next_heartbeat = now + *interval;
                    }
                }
                if now >= *next_persist {
                    *next_persist = now + self.config.persist_mark_every;
                    let epoch = *epoch;
                    out.push(Action::PersistMark {
                        mark_ms: self.clock.advance(now),
                        epoch,
                    });
                }
            }
        }
        out
    }

    fn close(&mut self, now: Duration, reason: CloseReason, out: &mut Vec<Action>) {
        out.push(Action::Close { reason });
        self.retry_later(now, out);
    }

    fn retry_later(&mut self, now: Duration, out: &mut Vec<Action>) {
        let delay = self.backoff.next_delay(&mut self.rng);
        self.state = State::Idle {
            dial_at: now + delay,
        };
        out.push(Action::Disconnected { retry_in: delay });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);
    const HB: Duration = Duration::from_secs(10);

    fn welcome(epoch: u64, server_time_ms: i64) -> Event {
        Event::Welcome {
            epoch,
            server_time_ms,
            heartbeat_interval: HB,
            first_retry: Duration::ZERO,
        }
    }

    fn connect(s: &mut Session, now: Duration) -> Vec<Action> {
        let a = s.handle(now, Event::Tick);
        assert_eq!(a, vec![Action::Dial]);
        s.handle(now, Event::Connected)
    }

    #[test]
    fn stream_errors_are_reconnects_or_refusals() {
        let expired = Event::stream_error(
            StreamStatus::Unauthenticated,
            "Unauthenticated",
            "certificate expired; renew and reconnect",
        );
        assert!(matches!(expired, Event::Closed { .. }));
        for status in [
            StreamStatus::Unauthenticated,
            StreamStatus::PermissionDenied,
        ] {
            assert_eq!(
                Event::stream_error(status, "x", "node nd-1 was deleted"),
                Event::Refused {
                    message: "node nd-1 was deleted".into()
                }
            );
        }
        assert_eq!(
            Event::stream_error(StreamStatus::Other, "Unavailable", "fenced"),
            Event::Closed {
                error: "Unavailable: fenced".into()
            }
        );
        let Event::Refused { message } = Event::revoked("duplicate-identity") else {
            panic!("a revocation is a refusal");
        };
        assert!(
            message.contains("duplicate-identity") && message.contains("bcd join --reset --yes")
        );
        // A refusal stops the session for good.
        let mut s = Session::new(SessionConfig::default(), 1, 0, 0);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(S, Event::revoked("revoked"));
        assert!(matches!(a.last(), Some(Action::Stop { .. })));
        assert!(s.is_stopped());
    }

    #[test]
    fn the_first_redial_is_within_the_servers_window() {
        for seed in 0..50 {
            let mut s = Session::new(SessionConfig::default(), seed, 0, 0);
            connect(&mut s, Duration::ZERO);
            s.handle(
                S,
                Event::Welcome {
                    epoch: 1,
                    server_time_ms: 1_000,
                    heartbeat_interval: HB,
                    first_retry: Duration::from_millis(150),
                },
            );
            let a = s.handle(
                2 * S,
                Event::Closed {
                    error: "reset".into(),
                },
            );
            let Some(Action::Disconnected { retry_in }) = a.last() else {
                panic!("{a:?}");
            };
            assert!(*retry_in <= Duration::from_millis(150), "{retry_in:?}");
        }
    }

    #[test]
    fn hello_welcome_heartbeats() {
        let mut s = Session::new(SessionConfig::default(), 1, 5_000, 7);
        let hello = connect(&mut s, Duration::ZERO);
        assert_eq!(
            hello,
            vec![Action::SendHello {
                last_epoch: 7,
                mark_ms: 5_000
            }]
        );
        let a = s.handle(S, welcome(8, 1_000_000));
        assert!(a.contains(&Action::Established {
            epoch: 8,
            server_time_ms: 1_000_000
        }));
        assert!(a.contains(&Action::PersistMark {
            mark_ms: 1_000_000,
            epoch: 8
        }));
        assert_eq!(s.deadline(), Some(S + HB));
        assert_eq!(
            s.handle(S + HB, Event::Tick),
            vec![Action::SendHeartbeat { seq: 1 }]
        );
        s.handle(
            S + HB + S,
            Event::HeartbeatAck {
                server_time_ms: 1_011_000,
            },
        );
        assert_eq!(
            s.handle(S + HB * 2, Event::Tick),
            vec![Action::SendHeartbeat { seq: 2 }]
        );
    }

    #[test]
    fn three_silent_intervals_close_the_session() {
        let mut s = Session::new(SessionConfig::default(), 1, 0, 0);
        connect(&mut s, Duration::ZERO);
        s.handle(Duration::ZERO, welcome(1, 1_000));
        s.handle(HB, Event::Tick);
        s.handle(HB * 2, Event::Tick);
        let a = s.handle(HB * 3, Event::Tick);
        assert!(matches!(
            a[0],
            Action::Close {
                reason: CloseReason::ServerSilent { .. }
            }
        ));
        assert!(matches!(a[1], Action::Disconnected { retry_in } if retry_in <= S));
        assert!(!s.is_established());
    }

    #[test]
    fn stale_epoch_and_rewound_clock_are_refused() {
        let mut s = Session::new(SessionConfig::default(), 3, 10 * 60_000, 5);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(Duration::ZERO, welcome(5, 10 * 60_000));
        assert!(matches!(
            &a[0],
            Action::Close {
                reason: CloseReason::StaleEpoch(_)
            }
        ));
        let dial_at = s.deadline().unwrap();
        connect(&mut s, dial_at);
        let a = s.handle(dial_at, welcome(6, 4 * 60_000));
        assert!(matches!(
            &a[0],
            Action::Close {
                reason: CloseReason::ClockRefused(_)
            }
        ));
        // A refused clock leaves the epoch tracker untouched: epoch 6 is
        // still acceptable from an honest gateway.
        let dial_at = s.deadline().unwrap();
        connect(&mut s, dial_at);
        let a = s.handle(dial_at, welcome(6, 10 * 60_000));
        assert!(matches!(a[0], Action::Established { epoch: 6, .. }));
    }

    #[test]
    fn refused_stops_for_good() {
        let mut s = Session::new(SessionConfig::default(), 1, 0, 0);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(
            S,
            Event::Refused {
                message: "deleted".into(),
            },
        );
        assert!(a.contains(&Action::Stop {
            message: "deleted".into()
        }));
        assert!(s.is_stopped());
        assert_eq!(s.deadline(), None);
        assert!(s.handle(S * 100, Event::Tick).is_empty());
    }

    #[test]
    fn drain_reconnects_within_the_window_without_growing_backoff() {
        let mut s = Session::new(SessionConfig::default(), 9, 0, 0);
        connect(&mut s, Duration::ZERO);
        s.handle(Duration::ZERO, welcome(1, 1));
        let a = s.handle(
            S,
            Event::Drain {
                within: Duration::from_secs(60),
            },
        );
        assert_eq!(
            a[0],
            Action::Close {
                reason: CloseReason::Drain
            }
        );
        let dial_at = s.deadline().unwrap();
        assert!(dial_at <= S + Duration::from_secs(60));
        assert_eq!(s.backoff.attempt(), 0);
    }

    #[test]
    fn welcome_timeout() {
        let mut s = Session::new(SessionConfig::default(), 1, 0, 0);
        connect(&mut s, Duration::ZERO);
        assert!(s.handle(Duration::from_secs(29), Event::Tick).is_empty());
        let a = s.handle(Duration::from_secs(30), Event::Tick);
        assert_eq!(
            a[0],
            Action::Close {
                reason: CloseReason::WelcomeTimeout
            }
        );
    }

    fn event() -> impl Strategy<Value = (u64, Event)> {
        let ev = prop_oneof![
            4 => Just(Event::Tick),
            2 => Just(Event::Connected),
            1 => Just(Event::DialFailed { error: "refused".into() }),
            2 => (0u64..20, 0i64..3_000_000).prop_map(|(epoch, t)| Event::Welcome {
                epoch,
                server_time_ms: t,
                heartbeat_interval: HB,
                first_retry: Duration::ZERO,
            }),
            1 => (0i64..3_000_000).prop_map(|t| Event::HeartbeatAck { server_time_ms: t }),
            1 => Just(Event::Received),
            1 => Just(Event::Closed { error: "reset".into() }),
            1 => (0u64..60_000).prop_map(|ms| Event::Drain { within: Duration::from_millis(ms) }),
        ];
        (0u64..40_000, ev)
    }

    proptest! {
        /// Over any interleaving: a Hello only follows a Connected while
        /// dialing, at most one dial is outstanding, heartbeats only flow in
        /// an established session, accepted epochs strictly rise, the mark
        /// never moves backward, and every retry delay fits the back-off cap.
        #[test]
        fn session_rules_hold_over_random_interleavings(
            seed: u64,
            events in proptest::collection::vec(event(), 1..300),
        ) {
            let mut s = Session::new(SessionConfig::default(), seed, 0, 0);
            let mut now = Duration::ZERO;
            let mut t = Tracker::default();
            for (dt, ev) in events {
                now += Duration::from_millis(dt);
                // As the shell does: every deadline up to now gets its Tick
                // first, and each Tick moves the deadline forward.
                let mut ticks = 0;
                while let Some(d) = s.deadline().filter(|d| *d <= now) {
                    let (was_dialing, was_established) =
                        (matches!(s.state, State::Dialing), s.is_established());
                    let actions = s.handle(d, Event::Tick);
                    t.check(actions, was_dialing, was_established, false)?;
                    prop_assert!(s.deadline().is_none_or(|n| n >= d), "deadlines never move back");
                    ticks += 1;
                    prop_assert!(ticks < 10_000);
                }
                let was_dialing = matches!(s.state, State::Dialing);
                let was_established = s.is_established();
                let is_connected = matches!(ev, Event::Connected);
                let actions = s.handle(now, ev);
                t.check(actions, was_dialing, was_established, is_connected)?;
                prop_assert!(s.clock().mark_ms() >= t.last_mark);
            }
        }
    }

    #[derive(Default)]
    struct Tracker {
        dial_outstanding: bool,
        last_epoch: u64,
        last_mark: i64,
    }

    impl Tracker {
        fn check(
            &mut self,
            actions: Vec<Action>,
            was_dialing: bool,
            was_established: bool,
            is_connected: bool,
        ) -> Result<(), TestCaseError> {
            for a in actions {
                match a {
                    Action::Dial => {
                        prop_assert!(!self.dial_outstanding);
                        self.dial_outstanding = true;
                    }
                    Action::SendHello { .. } => {
                        prop_assert!(was_dialing && is_connected);
                        self.dial_outstanding = false;
                    }
                    Action::Disconnected { retry_in } => {
                        self.dial_outstanding = false;
                        prop_assert!(retry_in <= Duration::from_secs(60));
                    }
                    Action::SendHeartbeat { .. } => prop_assert!(was_established),
                    Action::Established { epoch, .. } => {
                        prop_assert!(epoch > self.last_epoch);
                        self.last_epoch = epoch;
                    }
                    Action::PersistMark { mark_ms, epoch } => {
                        prop_assert!(mark_ms >= self.last_mark);
                        prop_assert_eq!(epoch, self.last_epoch);
                        self.last_mark = mark_ms;
                    }
                    Action::Close { .. } | Action::Stop { .. } => {}
                }
            }
            Ok(())
        }
    }
}
