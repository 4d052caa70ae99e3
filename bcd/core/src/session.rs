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
//! every epoch accepted before (or too far above it) or its server time is
//! more than five minutes before the mark.
//!
//! Nothing a gateway sends unsigned can stop the node for good: only a
//! refusal whose typed reason is a deletion or a revocation, carrying a
//! statement signed by a worker key that names this node (and, for a
//! revocation, the certificate it presented), does ([`Event::stream_error`],
//! [`Event::revoked`]). Every other refusal, whatever its code or words, is
//! a broken stream: the node backs off and dials again. A Drain's window is
//! clamped to [`SessionConfig::max_drain`].

use std::time::Duration;

use crate::backoff::{Backoff, BackoffConfig};
use crate::clock::{ClockError, Mark, ServerClock};
use crate::epoch::{EpochError, EpochTracker};
use crate::rng::SplitMix64;

/// The longest heartbeat interval a Welcome may set (the spec's is 10 s):
/// the node closes a session silent for three of them.
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    pub backoff: BackoffConfig,
    /// From an open stream to a Welcome, at most.
    pub welcome_timeout: Duration,
    /// Server silence tolerated, counted in heartbeat intervals.
    pub missed_heartbeats: u32,
    /// How often the server time mark is handed to the shell to persist.
    pub persist_mark_every: Duration,
    /// The longest a Drain may make the node wait before it dials again
    /// (the spec spreads planned reconnects over up to 60 seconds).
    pub max_drain: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            backoff: BackoffConfig::default(),
            welcome_timeout: Duration::from_secs(30),
            missed_heartbeats: 3,
            persist_mark_every: Duration::from_secs(300),
            max_drain: Duration::from_secs(60),
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
    DialFailed { error: String },
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
        /// The server's first-redial window now (zero: keep the one the
        /// Welcome gave).
        first_retry: Duration,
    },
    /// Any other message from the server: evidence that it is alive.
    Received,
    /// A message carrying a time a key signed (a gateway revocation list,
    /// verified): server time was `issued_ms` at most `ahead` (plus the
    /// slack) before now. Evidence that the server is alive, too.
    SignedTime { issued_ms: i64, ahead: Duration },
    /// The server asks the node to reconnect elsewhere within `within`.
    Drain { within: Duration },
    /// The stream ended or broke.
    Closed { error: String },
    /// The server refused this node for good (deleted, revoked), as a
    /// worker-signed statement confirms: retrying with this identity cannot
    /// help. Only [`Event::stream_error`] and [`Event::revoked`] make one.
    Refused { message: String },
}

/// What a refusal claims, by its typed reason (the shell decodes the
/// reason from the status details, never from the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The node was deleted.
    NodeDeleted,
    /// The certificate the session presented was revoked.
    CertificateRevoked,
    /// Anything else (an expired certificate, an unknown one, a fenced
    /// gateway, an unknown reason, no reason at all).
    Other,
}

/// What a worker-signed statement says. The shell builds one only from a
/// statement whose signature verified against the worker keys the node
/// learned at join; whether it is about this node is decided here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub node_id: String,
    pub kind: StatementKind,
    /// Revoked serials; a deletion covers every certificate.
    pub serials: Vec<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    Deleted,
    Revoked,
}

/// The identity a session speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Me<'a> {
    pub node_id: &'a str,
    /// The serial of the certificate the session presents.
    pub serial: &'a str,
}

impl Statement {
    /// Whether this statement confirms `claim` about `me`: a deletion of
    /// this node, or a revocation of the certificate it presents.
    pub fn confirms(&self, claim: Claim, me: Me<'_>) -> bool {
        if self.node_id != me.node_id {
            return false;
        }
        match (claim, self.kind) {
            (Claim::NodeDeleted, StatementKind::Deleted) => true,
            // A deletion revokes every certificate of the node.
            (Claim::CertificateRevoked, StatementKind::Deleted) => true,
            (Claim::CertificateRevoked, StatementKind::Revoked) => {
                self.serials.iter().any(|s| s == me.serial)
            }
            (Claim::NodeDeleted, StatementKind::Revoked) | (Claim::Other, _) => false,
        }
    }

    fn stop_message(&self) -> String {
        match self.kind {
            // The old identity cannot be re-enrolled: a new node.
            StatementKind::Deleted => format!(
                "node {} was deleted: join again: bcd join --reset --yes, then bcd join \
                 --new-node",
                self.node_id
            ),
            StatementKind::Revoked => format!(
                "the node certificate was revoked ({}): join again: bcd join --reset --yes, then \
                 bcd join --new-node",
                self.reason
            ),
        }
    }
}

impl Event {
    /// The event for a stream the gateway ended with an error status.
    /// `claim` comes from the status's typed reason; `statement` is the
    /// verified statement it carried, if any. Only a deletion or revocation
    /// that the statement confirms for `me` stops the node; anything else is
    /// a broken stream, redialed with back-off (an expired certificate is
    /// renewed meanwhile).
    pub fn stream_error(
        claim: Claim,
        statement: Option<&Statement>,
        me: Me<'_>,
        code: &str,
        message: &str,
    ) -> Event {
        match statement {
            Some(s) if s.confirms(claim, me) => Event::Refused {
                message: s.stop_message(),
            },
            _ => Event::Closed {
                error: format!("{code}: {message}"),
            },
        }
    }

    /// A RevocationNotice: the node stops only when its verified statement
    /// confirms the revocation of this node's certificate. `None`: the
    /// notice is not obeyed (the shell logs it); the session goes on until
    /// the gateway ends it.
    pub fn revoked(statement: Option<&Statement>, me: Me<'_>) -> Option<Event> {
        statement
            .filter(|s| s.confirms(Claim::CertificateRevoked, me))
            .map(|s| Event::Refused {
                message: s.stop_message(),
            })
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
        mark: Mark,
        epoch: u64,
    },
    /// Give up: the daemon must exit with this message.
    Stop {
        message: String,
    },
    /// The gateway's server time is past the limit a signed time sets
    /// (once a session): it is not obeyed. Record it.
    ServerTimeAhead {
        said_ms: i64,
        limit_ms: i64,
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
    /// This session's gateway was found past the signed limit.
    ahead_reported: bool,
}

impl Session {
    /// The clock starts from the mark in `identity.json` and the node's
    /// clocks; `last_epoch` comes from `identity.json` too. The first dial
    /// is due immediately.
    pub fn new(config: SessionConfig, seed: u64, clock: ServerClock, last_epoch: u64) -> Self {
        Session {
            config,
            state: State::Idle {
                dial_at: Duration::ZERO,
            },
            backoff: Backoff::new(config.backoff),
            rng: SplitMix64::new(seed),
            clock,
            epochs: EpochTracker::new(last_epoch),
            heartbeat_seq: 0,
            ahead_reported: false,
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
        let event = match event {
            Event::SignedTime { issued_ms, ahead } => {
                self.clock.signed_time(now, issued_ms, ahead);
                Event::Received
            }
            e => e,
        };
        self.step(now, event, &mut out);
        if self.is_established()
            && !self.ahead_reported
            && let Some((said_ms, limit_ms)) = self.clock.ahead_of_signed(now)
        {
            self.ahead_reported = true;
            out.push(Action::ServerTimeAhead { said_ms, limit_ms });
        }
        out
    }

    fn step(&mut self, now: Duration, event: Event, out: &mut Vec<Action>) {
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
                self.retry_later(now, out);
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
                    self.close(now, CloseReason::ClockRefused(e), out);
                    return;
                }
                if let Err(e) = self.epochs.accept(epoch) {
                    self.close(now, CloseReason::StaleEpoch(e), out);
                    return;
                }
                self.clock = probe;
                self.ahead_reported = false;
                self.backoff.reset();
                self.backoff.set_base(Some(first_retry));
                // The interval is the gateway's word, unsigned: bounded, so a
                // gateway that names a day (and then falls silent) cannot keep
                // the node from noticing and redialling elsewhere.
                let interval =
                    heartbeat_interval.clamp(Duration::from_millis(10), MAX_HEARTBEAT_INTERVAL);
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
                    mark: self.clock.mark(),
                    epoch,
                });
            }
            (State::AwaitingWelcome { since }, Event::Tick) => {
                if now >= *since + self.config.welcome_timeout {
                    self.close(now, CloseReason::WelcomeTimeout, out);
                }
            }
            (
                State::AwaitingWelcome { .. } | State::Established { .. },
                Event::Closed { .. } | Event::DialFailed { .. },
            ) => {
                self.retry_later(now, out);
            }
            (
                State::AwaitingWelcome { .. } | State::Established { .. },
                Event::Drain { within },
            ) => {
                let within = within.min(self.config.max_drain);
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
                    Event::HeartbeatAck {
                        server_time_ms,
                        first_retry,
                    } => {
                        *last_heard = now;
                        self.clock.on_sample(now, server_time_ms);
                        if !first_retry.is_zero() {
                            self.backoff.set_base(Some(first_retry));
                        }
                    }
                    Event::Received | Event::Welcome { .. } => *last_heard = now,
                    _ => {}
                }
                let silent_for = now.saturating_sub(*last_heard);
                if silent_for >= *interval * self.config.missed_heartbeats {
                    self.close(now, CloseReason::ServerSilent { silent_for }, out);
                    return;
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
                    self.clock.advance(now);
                    out.push(Action::PersistMark {
                        mark: self.clock.mark(),
                        epoch,
                    });
                }
            }
        }
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

    fn clock(mark_ms: i64) -> ServerClock {
        ServerClock::new(
            Mark {
                ms: mark_ms,
                base: None,
            },
            crate::clock::Witness {
                boot_id: "boot".into(),
                boot_ms: 0,
                wall_ms: 0,
            },
        )
    }

    fn session(seed: u64, mark_ms: i64, last_epoch: u64) -> Session {
        Session::new(SessionConfig::default(), seed, clock(mark_ms), last_epoch)
    }

    const ME: Me<'static> = Me {
        node_id: "nd-1",
        serial: "0a",
    };

    fn statement(node: &str, kind: StatementKind, serials: &[&str]) -> Statement {
        Statement {
            node_id: node.into(),
            kind,
            serials: serials.iter().map(|s| s.to_string()).collect(),
            reason: "node-deleted".into(),
        }
    }

    fn connect(s: &mut Session, now: Duration) -> Vec<Action> {
        let a = s.handle(now, Event::Tick);
        assert_eq!(a, vec![Action::Dial]);
        s.handle(now, Event::Connected)
    }

    #[test]
    fn only_a_confirmed_deletion_or_revocation_stops_the_node() {
        let deleted = statement("nd-1", StatementKind::Deleted, &[]);
        let revoked = statement("nd-1", StatementKind::Revoked, &["0a"]);
        let Event::Refused { message } = Event::stream_error(
            Claim::NodeDeleted,
            Some(&deleted),
            ME,
            "Unauthenticated",
            "x",
        ) else {
            panic!("a confirmed deletion is a refusal");
        };
        assert!(
            message.contains("node nd-1 was deleted") && message.contains("bcd join --reset --yes"),
            "{message}"
        );
        assert!(matches!(
            Event::stream_error(Claim::CertificateRevoked, Some(&revoked), ME, "x", "y"),
            Event::Refused { .. }
        ));
        // A deletion revokes every certificate of the node.
        assert!(matches!(
            Event::stream_error(Claim::CertificateRevoked, Some(&deleted), ME, "x", "y"),
            Event::Refused { .. }
        ));
        // Everything else is a reconnect: no statement, another node's
        // statement, another certificate's revocation, a revocation offered
        // as a deletion, a statement under a reason that ends nothing.
        let other_node = statement("nd-2", StatementKind::Deleted, &[]);
        let other_cert = statement("nd-1", StatementKind::Revoked, &["0b"]);
        for (claim, st) in [
            (Claim::NodeDeleted, None),
            (Claim::CertificateRevoked, None),
            (Claim::NodeDeleted, Some(&other_node)),
            (Claim::CertificateRevoked, Some(&other_cert)),
            (Claim::NodeDeleted, Some(&revoked)),
            (Claim::Other, Some(&deleted)),
        ] {
            assert_eq!(
                Event::stream_error(claim, st, ME, "Unauthenticated", "node nd-1 was deleted"),
                Event::Closed {
                    error: "Unauthenticated: node nd-1 was deleted".into()
                },
                "{claim:?} {st:?}"
            );
        }
        assert_eq!(Event::revoked(None, ME), None);
        assert_eq!(Event::revoked(Some(&other_cert), ME), None);
        let Some(Event::Refused { message }) = Event::revoked(Some(&revoked), ME) else {
            panic!("a confirmed revocation is a refusal");
        };
        assert!(message.contains("revoked (node-deleted)"), "{message}");
        // A refusal stops the session for good.
        let mut s = session(1, 0, 0);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(S, Event::revoked(Some(&revoked), ME).unwrap());
        assert!(matches!(a.last(), Some(Action::Stop { .. })));
        assert!(s.is_stopped());
        // An unconfirmed one is a reconnect with back-off.
        let mut s = session(1, 0, 0);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(
            S,
            Event::stream_error(Claim::NodeDeleted, None, ME, "Unauthenticated", "deleted"),
        );
        assert!(matches!(a.last(), Some(Action::Disconnected { retry_in }) if *retry_in <= S));
        assert!(!s.is_stopped());
        assert!(s.deadline().is_some());
    }

    /// The delay before the first redial of a session (seed `seed`) whose
    /// Welcome gave the window `welcome` and, when `acked` is some, whose
    /// one heartbeat ack then gave that window.
    fn first_redial(seed: u64, welcome: Duration, acked: Option<Duration>) -> Duration {
        let mut s = session(seed, 0, 0);
        connect(&mut s, Duration::ZERO);
        s.handle(
            S,
            Event::Welcome {
                epoch: 1,
                server_time_ms: 1_000,
                heartbeat_interval: HB,
                first_retry: welcome,
            },
        );
        if let Some(first_retry) = acked {
            s.handle(
                S + HB,
                Event::HeartbeatAck {
                    server_time_ms: 1_000 + HB.as_millis() as i64,
                    first_retry,
                },
            );
        }
        let a = s.handle(
            S + HB + S,
            Event::Closed {
                error: "reset".into(),
            },
        );
        match a.last() {
            Some(Action::Disconnected { retry_in }) => *retry_in,
            _ => panic!("{a:?}"),
        }
    }

    #[test]
    fn the_first_redial_is_within_the_servers_window() {
        for seed in 0..50 {
            let d = first_redial(seed, Duration::from_millis(150), None);
            assert!(d <= Duration::from_millis(150), "{d:?}");
        }
    }

    #[test]
    fn a_heartbeat_ack_resizes_the_first_redial_window_and_zero_keeps_it() {
        // The Welcome's window was sized when the fleet was small; the
        // acks carry the server's window as the fleet grows. An ack from a
        // server that does not send one (zero) keeps the Welcome's.
        let ms = Duration::from_millis;
        assert!((0..200).all(|seed| first_redial(seed, ms(150), Some(Duration::ZERO)) <= ms(150)));
        let resized: Vec<Duration> = (0..200)
            .map(|seed| first_redial(seed, ms(150), Some(ms(5_000))))
            .collect();
        assert!(resized.iter().all(|d| *d <= ms(5_000)));
        assert!(
            resized.iter().any(|d| *d > ms(1_000)),
            "the acked window is used, not the Welcome's: {resized:?}"
        );
    }

    #[test]
    fn hello_welcome_heartbeats() {
        let mut s = session(1, 5_000, 7);
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
        // The mark moves only as far as the node's clocks allow (no wall
        // clock here, one second of boot clock): the Welcome is anchored,
        // the mark is bounded.
        assert!(a.iter().any(|a| matches!(
            a,
            Action::PersistMark { mark, epoch: 8 } if mark.ms == 5_000 + 1_000
        )));
        assert_eq!(s.clock().server_now(S), Some(1_000_000));
        assert_eq!(s.deadline(), Some(S + HB));
        assert_eq!(
            s.handle(S + HB, Event::Tick),
            vec![Action::SendHeartbeat { seq: 1 }]
        );
        s.handle(
            S + HB + S,
            Event::HeartbeatAck {
                server_time_ms: 1_011_000,
                first_retry: Duration::ZERO,
            },
        );
        assert_eq!(
            s.handle(S + HB * 2, Event::Tick),
            vec![Action::SendHeartbeat { seq: 2 }]
        );
    }

    #[test]
    fn three_silent_intervals_close_the_session() {
        let mut s = session(1, 0, 0);
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
    fn a_welcome_cannot_stretch_the_heartbeat_past_its_bound() {
        let mut s = session(1, 0, 0);
        connect(&mut s, Duration::ZERO);
        s.handle(
            Duration::ZERO,
            Event::Welcome {
                epoch: 1,
                server_time_ms: 1_000,
                heartbeat_interval: Duration::from_secs(86_400),
                first_retry: Duration::ZERO,
            },
        );
        assert_eq!(s.deadline(), Some(MAX_HEARTBEAT_INTERVAL));
        assert_eq!(
            s.handle(MAX_HEARTBEAT_INTERVAL, Event::Tick),
            vec![Action::SendHeartbeat { seq: 1 }]
        );
        s.handle(MAX_HEARTBEAT_INTERVAL * 2, Event::Tick);
        // The gateway said a day and then fell silent: the node notices
        // after three bounded intervals and redials.
        let a = s.handle(MAX_HEARTBEAT_INTERVAL * 3, Event::Tick);
        assert!(
            matches!(
                a[0],
                Action::Close {
                    reason: CloseReason::ServerSilent { .. }
                }
            ),
            "{a:?}"
        );
    }

    #[test]
    fn stale_epoch_and_rewound_clock_are_refused() {
        let mut s = session(3, 10 * 60_000, 5);
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
        let mut s = session(1, 0, 0);
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
        let mut s = session(9, 0, 0);
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
    fn an_endless_drain_is_clamped_to_the_longest_spread() {
        for seed in 0..50 {
            let mut s = session(seed, 0, 0);
            connect(&mut s, Duration::ZERO);
            s.handle(Duration::ZERO, welcome(1, 1));
            let a = s.handle(
                S,
                Event::Drain {
                    within: Duration::from_millis(u64::from(u32::MAX)),
                },
            );
            let Some(Action::Disconnected { retry_in }) = a.last() else {
                panic!("{a:?}");
            };
            assert!(*retry_in <= Duration::from_secs(60), "{retry_in:?}");
            assert!(s.deadline().unwrap() <= S + Duration::from_secs(60));
        }
    }

    #[test]
    fn a_huge_epoch_is_refused_and_the_next_honest_one_accepted() {
        let mut s = session(1, 0, 7);
        connect(&mut s, Duration::ZERO);
        let a = s.handle(Duration::ZERO, welcome(u64::MAX, 1_000));
        assert!(matches!(
            &a[0],
            Action::Close {
                reason: CloseReason::StaleEpoch(EpochError::TooFar { .. })
            }
        ));
        let dial_at = s.deadline().unwrap();
        let hello = connect(&mut s, dial_at);
        assert_eq!(
            hello,
            vec![Action::SendHello {
                last_epoch: 7,
                mark_ms: 0
            }],
            "the refused epoch was not taken"
        );
        let a = s.handle(dial_at, welcome(crate::epoch::next_epoch(7, 7), 1_000));
        assert!(matches!(a[0], Action::Established { epoch: 8, .. }));
    }

    #[test]
    fn welcome_timeout() {
        let mut s = session(1, 0, 0);
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

    #[test]
    fn a_welcome_past_the_signed_limit_is_held_to_it_and_reported_once() {
        let mut s = session(1, 1_000_000, 0);
        connect(&mut s, S);
        // The node holds a list signed at 1,000,000 (lists every minute).
        let ahead = Duration::from_secs(60);
        assert!(
            s.handle(
                S,
                Event::SignedTime {
                    issued_ms: 1_000_000,
                    ahead
                }
            )
            .is_empty()
        );
        let a = s.handle(S, welcome(1, 1_000_000 + 86_400_000));
        let limit = 1_000_000 + 60_000 + crate::clock::SLACK.as_millis() as i64;
        assert!(matches!(a[0], Action::Established { epoch: 1, .. }));
        assert_eq!(
            a.last(),
            Some(&Action::ServerTimeAhead {
                said_ms: 1_000_000 + 86_400_000,
                limit_ms: limit
            })
        );
        assert_eq!(s.clock().server_now(S), Some(limit));
        // Once a session.
        let a = s.handle(
            S,
            Event::HeartbeatAck {
                server_time_ms: 1_000_000 + 2 * 86_400_000,
                first_retry: Duration::ZERO,
            },
        );
        assert!(
            !a.iter()
                .any(|a| matches!(a, Action::ServerTimeAhead { .. }))
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
            1 => (0i64..3_000_000, 0u64..100_000).prop_map(|(t, r)| Event::HeartbeatAck {
                server_time_ms: t,
                first_retry: Duration::from_millis(r),
            }),
            1 => Just(Event::Received),
            1 => (0i64..3_000_000).prop_map(|t| Event::SignedTime {
                issued_ms: t,
                ahead: Duration::from_secs(60),
            }),
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
            let mut s = session(seed, 0, 0);
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
        ahead_this_session: bool,
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
                        self.ahead_this_session = false;
                        prop_assert!(epoch > self.last_epoch);
                        self.last_epoch = epoch;
                    }
                    Action::PersistMark { mark, epoch } => {
                        prop_assert!(mark.ms >= self.last_mark);
                        prop_assert_eq!(epoch, self.last_epoch);
                        self.last_mark = mark.ms;
                    }
                    Action::ServerTimeAhead { said_ms, limit_ms } => {
                        prop_assert!(said_ms > limit_ms);
                        prop_assert!(!self.ahead_this_session, "reported once a session");
                        self.ahead_this_session = true;
                    }
                    Action::Close { .. } | Action::Stop { .. } => {}
                }
            }
            Ok(())
        }
    }
}
