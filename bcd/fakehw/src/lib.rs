//! Fake hardware for bcd, and fleets of simulated nodes in one process.
//!
//! [`host::FakeHost`] implements the agent's hardware traits
//! (`bcd_agent::hw::Host`, `Gpus`, `Tpm`) from outside the agent: seeded,
//! deterministic, and cheap enough to run thousands in one process. The
//! simulator ([`sim::Fleet`]) runs the real agent code (`bcd_agent::node`)
//! on such machines, each node with its own data directory, key,
//! certificate, journal and TLS session.
//!
//! It must never be linked into a release `bcd`: only the `fakehw` feature
//! of the `bcd` binary package (`bcd/bin`) pulls it in, for `bcd sim` and
//! `--fake-hw`; the server's simulator (`bc-sim`) and the system
//! tests use it directly. Its neighbours: `bcd-agent` (the traits and the
//! daemon it drives), `bcd-core` (its seeded generator).
#![forbid(unsafe_code)]

pub mod host;
pub mod sim;

pub use host::{FakeHost, TreePower};
