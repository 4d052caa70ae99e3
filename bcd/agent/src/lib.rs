//! The node daemon's library: the tokio shell around `bcd-core`'s state
//! machines, the data directory (identity, journal, lock), the hardware
//! traits with their real implementations, and the subcommands' logic. The
//! `bcd` binary (`bcd/bin`) only parses arguments and maps results to exit
//! codes; fake hardware and the simulator live in `bcd-fakehw`
//! (`bcd/fakehw`) and are never linked into a release.
//!
//! Decisions (back-off, epochs, the server time mark, session liveness) live
//! in `bcd-core` and must not move here; wire types live in `bcd-proto`.
#![forbid(unsafe_code)]
// Unit tests are exempt from the one-clock rule (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod client;
pub mod converge;
pub mod daemon;
pub mod doctor;
pub mod effects;
pub mod events;
pub mod failpoints;
pub mod helper;
pub mod hw;
pub mod identity;
pub mod init;
pub mod join;
pub mod journal;
pub mod lock;
pub mod metrics;
pub mod node;
pub mod slots;
pub mod tpm_key;
pub mod upgrade;
