//! The node daemon's library: the tokio shell around `bcd-core`'s state
//! machines, the data directory (identity, journal, lock), the hardware
//! traits with their real and fake implementations, and the subcommands'
//! logic. The `bcd` binary (`main.rs`) only parses arguments and maps
//! results to exit codes.
//!
//! Decisions (back-off, epochs, the server time mark, session liveness) live
//! in `bcd-core` and must not move here; wire types live in `bcd-proto`.
#![forbid(unsafe_code)]

pub mod access;
pub mod converge;
pub mod crash;
pub mod effects;
pub mod hw;
pub mod identity;
pub mod init;
pub mod join;
pub mod journal;
pub mod lock;
pub mod node;
#[cfg(feature = "fakehw")]
pub mod sim;
pub mod slots;
pub mod upgrade;
