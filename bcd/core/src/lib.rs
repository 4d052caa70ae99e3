//! Sans-IO state machines of the bcd node daemon.
//!
//! This crate owns the decisions that must survive crashes, reconnects and
//! clock trouble: the reconnect back-off, the session's life (Hello, Welcome,
//! heartbeats, silence, what a stream's end means), the session epoch rules
//! shared with the gateway, the server time mark, the exactly-once command
//! rules, the A/B update decisions, certificate renewal scheduling, what is
//! worth reporting to the server, and which specs are enforced. Everything
//! here is plain data in, decisions out; time is always a parameter and
//! randomness comes from a seeded generator, so the rules are tested
//! exhaustively without sleeping.
//!
//! It must not do I/O: no sockets, files, clocks or threads. The tokio shell
//! that performs the actions lives in `bcd-agent` (`bcd/agent`); the wire
//! types live in `bcd-proto` (`bcd/proto`); the server applies the epoch rules
//! inside its store transactions (`server/`).
#![forbid(unsafe_code)]

pub mod backoff;
pub mod clock;
pub mod command;
pub mod crash_loop;
pub mod epoch;
pub mod gateways;
pub mod renewal;
pub mod report;
pub mod rng;
pub mod session;
pub mod spec;
pub mod update;

pub use backoff::{Backoff, BackoffConfig};
pub use clock::{ClockError, Mark, ServerClock, Witness};
pub use epoch::{EpochError, EpochTracker};
pub use renewal::{CertLife, Renewal, RenewalConfig};
pub use report::{Reports, Status};
pub use rng::SplitMix64;
pub use session::{
    Action, Claim, CloseReason, Event, Me, Session, SessionConfig, Statement, StatementKind,
};
