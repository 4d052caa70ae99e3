//! Host helpers shared by the node daemon (`bcd-agent`, `bcd/agent`), its
//! privileged helper and the server: one copy of each.
//!
//! - [`fs`]: the durable file write every persisted file goes through (a
//!   temporary file beside the target, fsync, rename, fsync of the
//!   directory), write-if-changed, leftovers of interrupted writes, and the
//!   name a file is moved aside to;
//! - [`error`]: the one printer of an error's source chain;
//! - [`log`]: the tracing set-up of every binary (levels, filter and JSON
//!   output from environment variables);
//! - [`clock`]: the host clocks (wall and boot) for the shells; decisions
//!   never read them, they take time as a parameter (`bcd-core`).
//!
//! It must not hold policy or know any file format: callers decide what to
//! write and where. Its neighbours: `bcd-core` (decisions, no I/O),
//! `bcd-agent` (the daemon's shell, the main user).
#![forbid(unsafe_code)]

pub mod clock;
pub mod error;
pub mod fs;
pub mod log;
